package runtime

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ensureImage makes the container's image present per its imagePullPolicy
// and returns the image reference to run.
func (m *Manager) ensureImage(ctx context.Context, svc *services, pod *v1.Pod, c *v1.Container,
	sandbox *runtimeapi.PodSandboxConfig, objects ObjectSource, events EventRecorder) (string, error) {
	spec := &runtimeapi.ImageSpec{Image: c.Image}
	policy := c.ImagePullPolicy
	if policy == "" {
		policy = v1.PullIfNotPresent
		if strings.HasSuffix(c.Image, ":latest") || !strings.Contains(lastPathPart(c.Image), ":") && !strings.Contains(c.Image, "@") {
			policy = v1.PullAlways
		}
	}
	if policy != v1.PullAlways {
		resp, err := svc.image.ImageStatus(ctx, spec, false)
		if err != nil {
			return "", fmt.Errorf("check image %q: %w", c.Image, m.conn.classify(err))
		}
		if img := resp.GetImage(); img != nil {
			events.Event(pod, v1.EventTypeNormal, "Pulled", fmt.Sprintf("Container image %q already present on machine", c.Image))
			return img.Id, nil
		}
		if policy == v1.PullNever {
			msg := fmt.Sprintf("Container image %q is not present with pull policy of Never", c.Image)
			events.Event(pod, v1.EventTypeWarning, "ErrImageNeverPull", msg)
			return "", fmt.Errorf("%w: %s", ErrImageNeverPull, msg)
		}
	}
	auths, err := pullAuths(pod, c.Image, objects)
	if err != nil {
		return "", fmt.Errorf("read pull secrets for image %q: %w", c.Image, err)
	}
	events.Event(pod, v1.EventTypeNormal, "Pulling", fmt.Sprintf("Pulling image %q", c.Image))
	start := time.Now()
	var pullErr error
	for _, auth := range auths {
		ref, err := svc.image.PullImage(ctx, spec, auth, sandbox)
		if err == nil {
			events.Event(pod, v1.EventTypeNormal, "Pulled", fmt.Sprintf("Successfully pulled image %q in %s", c.Image, time.Since(start).Round(time.Millisecond)))
			return ref, nil
		}
		pullErr = errors.Join(pullErr, m.conn.classify(err))
	}
	events.Event(pod, v1.EventTypeWarning, "Failed", fmt.Sprintf("Failed to pull image %q: %v", c.Image, pullErr))
	return "", fmt.Errorf("%w: pull image %q: %w", ErrImagePull, c.Image, pullErr)
}

func lastPathPart(image string) string {
	if i := strings.LastIndex(image, "/"); i >= 0 {
		return image[i+1:]
	}
	return image
}

// imageRegistry returns the registry host of an image reference.
func imageRegistry(image string) string {
	first, _, found := strings.Cut(image, "/")
	if !found || (!strings.ContainsAny(first, ".:") && first != "localhost") {
		return "docker.io"
	}
	return first
}

// normalizeRegistry maps the spellings of a registry key in a docker
// config to a host name.
func normalizeRegistry(key string) string {
	key = strings.TrimPrefix(strings.TrimPrefix(key, "https://"), "http://")
	key, _, _ = strings.Cut(key, "/")
	switch key {
	case "index.docker.io", "registry-1.docker.io":
		return "docker.io"
	}
	return key
}

type dockerConfigJSON struct {
	Auths map[string]struct {
		Username      string `json:"username"`
		Password      string `json:"password"`
		Auth          string `json:"auth"`
		IdentityToken string `json:"identitytoken"`
		RegistryToken string `json:"registrytoken"`
	} `json:"auths"`
}

// pullAuths returns the credentials to try for image, ending with anonymous.
func pullAuths(pod *v1.Pod, image string, objects ObjectSource) ([]*runtimeapi.AuthConfig, error) {
	registry := imageRegistry(image)
	var auths []*runtimeapi.AuthConfig
	for _, ref := range pod.Spec.ImagePullSecrets {
		s, err := objects.Secret(pod.Namespace, ref.Name)
		if err != nil || s == nil || s.Type != v1.SecretTypeDockerConfigJson {
			continue // the kubelet also ignores missing or foreign pull secrets
		}
		var cfg dockerConfigJSON
		if err := json.Unmarshal(s.Data[v1.DockerConfigJsonKey], &cfg); err != nil {
			return nil, fmt.Errorf("secret %s/%s: malformed %s", pod.Namespace, ref.Name, v1.DockerConfigJsonKey)
		}
		for _, key := range sortedKeys(cfg.Auths) {
			if normalizeRegistry(key) != registry {
				continue
			}
			a := cfg.Auths[key]
			auth := &runtimeapi.AuthConfig{
				Username: a.Username, Password: a.Password, Auth: a.Auth,
				ServerAddress: registry, IdentityToken: a.IdentityToken, RegistryToken: a.RegistryToken,
			}
			if auth.Username == "" && a.Auth != "" {
				if raw, err := base64.StdEncoding.DecodeString(a.Auth); err == nil {
					auth.Username, auth.Password, _ = strings.Cut(string(raw), ":")
				}
			}
			auths = append(auths, auth)
		}
	}
	return append(auths, nil), nil
}
