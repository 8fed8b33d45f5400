package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	criclient "k8s.io/cri-client/pkg"

	"github.com/mqlet/mqlet/internal/testutil/containerd"
)

// TestRegistryTestBed checks the test bed itself: the plain and the TLS +
// htpasswd registries hold the pushed busybox under several names, the test
// containerd trusts the test CA, and an authenticated pull needs the password.
func TestRegistryTestBed(t *testing.T) {
	plain := StartRegistry(t, false)
	secure := StartRegistry(t, true)
	var refs []string
	for _, name := range []string{"mqlet/busybox:1", "mqlet/busybox:latest", "tools/box:v2"} {
		refs = append(refs, plain.Push(containerd.BusyboxImage, name), secure.Push(containerd.BusyboxImage, name))
	}
	ctx, cancel := criCtx()
	defer cancel()
	img, err := criclient.NewRemoteImageService(ctx, containerd.Endpoint(t), 10*time.Second, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	pull := func(ref string, auth *runtimeapi.AuthConfig) error {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		_, err := img.PullImage(ctx, &runtimeapi.ImageSpec{Image: ref}, auth, nil)
		if err == nil {
			// Only this name: CRI's RemoveImage would drop every tag of the
			// image, the local busybox too.
			untag(t, ref)
		}
		return err
	}
	for _, ref := range refs {
		var auth *runtimeapi.AuthConfig
		if strings.HasPrefix(ref, secure.Host) {
			auth = &runtimeapi.AuthConfig{Username: secure.User, Password: secure.Pass}
		}
		if err := pull(ref, auth); err != nil {
			t.Errorf("pull %s: %v", ref, err)
		}
	}
	err = pull(secure.Host+"/mqlet/busybox:1", nil)
	if err == nil || !strings.Contains(err.Error(), "401 Unauthorized") {
		t.Errorf("pull without credentials: want the registry's 401 Unauthorized, got %v", err)
	}
	err = pull(secure.Host+"/mqlet/busybox:1", &runtimeapi.AuthConfig{Username: secure.User, Password: "wrong"})
	if err == nil || !strings.Contains(err.Error(), "401 Unauthorized") {
		t.Errorf("pull with a wrong password: want the registry's 401 Unauthorized, got %v", err)
	}
}
