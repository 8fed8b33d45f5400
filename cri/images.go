package cri

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/kubernetes/pkg/credentialprovider"
	credentialsecrets "k8s.io/kubernetes/pkg/credentialprovider/secrets"
	"k8s.io/kubernetes/pkg/util/parsers"
)

// pullingRecheck is how soon a pod waiting on a pull is looked at again if
// the wake from the puller were lost (the wake normally comes first).
const pullingRecheck = 30 * time.Second

// backOffRecheck is how soon a pod whose pull just failed is synced again
// to report ImagePullBackOff, as the kubelet's next sync does.
const backOffRecheck = time.Second

// pullPolicy is the container's imagePullPolicy with the API defaults
// applied: Always for :latest or no tag, IfNotPresent otherwise.
func pullPolicy(c *v1.Container) v1.PullPolicy {
	if c.ImagePullPolicy != "" {
		return c.ImagePullPolicy
	}
	if strings.HasSuffix(c.Image, ":latest") || !strings.Contains(lastPathPart(c.Image), ":") && !strings.Contains(c.Image, "@") {
		return v1.PullAlways
	}
	return v1.PullIfNotPresent
}

// ensureImage makes the container's image present per its imagePullPolicy
// and returns the image reference to run. A pull runs in the background
// (see imagePuller): while it runs, or while the image is in backoff, the
// returned *ContainerError carries RetryAfter.
func (m *Manager) ensureImage(ctx context.Context, svc *services, pod *v1.Pod, c *v1.Container,
	sandbox *runtimeapi.PodSandboxConfig, objects ObjectSource, events EventRecorder) (string, error) {
	spec := &runtimeapi.ImageSpec{Image: c.Image}
	policy := pullPolicy(c)
	if policy != v1.PullAlways {
		resp, err := svc.image.ImageStatus(ctx, spec, false)
		if err != nil {
			return "", fmt.Errorf("check image %q: %w", c.Image, err)
		}
		if img := resp.GetImage(); img != nil {
			if pl := m.puller.take(string(pod.UID), c.Image); pl != nil {
				events.Event(pod, v1.EventTypeNormal, "Pulled", pulledMessage(c.Image, pl))
			} else {
				events.Event(pod, v1.EventTypeNormal, "Pulled", fmt.Sprintf("Container image %q already present on machine", c.Image))
			}
			return img.Id, nil
		}
		if policy == v1.PullNever {
			msg := fmt.Sprintf("Container image %q is not present with pull policy of Never", c.Image)
			events.Event(pod, v1.EventTypeWarning, "ErrImageNeverPull", msg)
			return "", fmt.Errorf("%w: %s", ErrImageNeverPull, msg)
		}
	}
	auths, err := m.pullAuths(pod, c.Image, objects)
	if err != nil {
		err = fmt.Errorf("read pull secrets for image %q: %w", c.Image, err)
		events.Event(pod, v1.EventTypeWarning, "Failed", err.Error())
		return "", &ContainerError{Container: c.Name, Reason: "ErrImagePull", Err: err, Definite: true}
	}
	w := pullWork{image: c.Image, auths: auths, sandbox: sandbox}
	res := m.puller.request(string(pod.UID), pullKey(w), w)
	switch res.state {
	case pullStarted:
		events.Event(pod, v1.EventTypeNormal, "Pulling", fmt.Sprintf("Pulling image %q", c.Image))
		fallthrough
	case pullWaiting:
		return "", &ContainerError{Container: c.Name, Reason: "ContainerCreating", RetryAfter: pullingRecheck,
			Err: fmt.Errorf("pulling image %q", c.Image)}
	case pullDone:
		events.Event(pod, v1.EventTypeNormal, "Pulled", pulledMessage(c.Image, res.pull))
		return res.pull.ref, nil
	case pullFailed:
		events.Event(pod, v1.EventTypeWarning, "Failed", fmt.Sprintf("Failed to pull image %q: %v", c.Image, res.err))
		return "", &ContainerError{Container: c.Name, Reason: "ErrImagePull", RetryAfter: backOffRecheck, Definite: res.definite,
			Err: fmt.Errorf("%w: pull image %q: %w", ErrImagePull, c.Image, res.err)}
	default: // pullBackOff
		// Once per pod and failed pull (not per sync), and the wait stays out
		// of the message, so each retry counts into the same event.
		if res.announce {
			events.Event(pod, v1.EventTypeNormal, "BackOff", fmt.Sprintf("Back-off pulling image %q", c.Image))
		}
		return "", &ContainerError{Container: c.Name, Reason: "ImagePullBackOff", RetryAfter: res.wait + 10*time.Millisecond, Definite: res.definite,
			Err: fmt.Errorf("Back-off pulling image %q: %w: %w", c.Image, ErrImagePull, res.err)}
	}
}

// pulledMessage is the kubelet's Pulled event text for a finished pull.
func pulledMessage(image string, pl *imagePull) string {
	return fmt.Sprintf("Successfully pulled image %q in %s (%s including waiting). Image size: %d bytes.",
		image, pl.finished.Sub(pl.began).Round(time.Millisecond), pl.finished.Sub(pl.queued).Round(time.Millisecond), pl.size)
}

// pullImage is the puller's pullFunc: one CRI PullImage and the size of
// what it pulled.
func (m *Manager) pullImage(ctx context.Context, w pullWork, auth *runtimeapi.AuthConfig) (string, uint64, error) {
	svc, err := m.conn.get()
	if err != nil {
		return "", 0, err
	}
	ctx = quietContext(ctx)
	if err := m.cfg.Registries.CheckResolved(ctx, w.image); err != nil {
		return "", 0, newPullError(w.image, err)
	}
	ref, err := svc.image.PullImage(ctx, &runtimeapi.ImageSpec{Image: w.image}, auth, w.sandbox)
	if err != nil {
		// The registry's own words stay in the node's log: what is
		// published (events, status, reply) is the class and the host.
		m.log.Warn().Err(err).Str("image", w.image).Msg("image pull failed")
		return "", 0, newPullError(w.image, err)
	}
	var size uint64
	if resp, err := svc.image.ImageStatus(ctx, &runtimeapi.ImageSpec{Image: ref}, false); err == nil {
		size = resp.GetImage().GetSize()
	}
	return ref, size, nil
}

// pullKey tells pulls apart by image and credentials, so a pod never rides
// on a pull made with credentials it was not given.
func pullKey(w pullWork) string {
	h := sha256.New()
	for _, a := range w.auths {
		if a == nil {
			h.Write([]byte{0})
			continue
		}
		for _, s := range []string{a.Username, a.Password, a.Auth, a.ServerAddress, a.IdentityToken, a.RegistryToken} {
			h.Write([]byte(s))
			h.Write([]byte{0})
		}
	}
	return w.image + "\x00" + hex.EncodeToString(h.Sum(nil))
}

func lastPathPart(image string) string {
	if i := strings.LastIndex(image, "/"); i >= 0 {
		return image[i+1:]
	}
	return image
}

// pullAuths returns the credentials to try for image, the kubelet's way:
// the pod's imagePullSecrets (kubernetes.io/dockerconfigjson and the legacy
// kubernetes.io/dockercfg) and then the node's credentials, each matched by
// registry host and path with the kubelet's keyring (most specific first,
// with or without scheme and port). With no match: one anonymous attempt.
func (m *Manager) pullAuths(pod *v1.Pod, image string, objects ObjectSource) ([]*runtimeapi.AuthConfig, error) {
	var secrets []v1.Secret
	for _, ref := range pod.Spec.ImagePullSecrets {
		s, err := objects.Secret(pod.Namespace, ref.Name)
		if err != nil || s == nil {
			continue // the kubelet also pulls without a missing secret
		}
		secrets = append(secrets, *s)
	}
	node := m.nodeKeyring()
	keyring, err := credentialsecrets.MakeDockerKeyring(secrets, node)
	if err != nil {
		// The decoder's own message may quote the secret's bytes.
		return nil, errors.New("a pull secret is not a valid docker config")
	}
	repo, _, _, err := parsers.ParseImageName(image)
	if err != nil {
		return nil, fmt.Errorf("parse image name: %w", err)
	}
	creds, ok := keyring.Lookup(repo)
	if !ok || len(creds) == 0 {
		return []*runtimeapi.AuthConfig{nil}, nil
	}
	out := make([]*runtimeapi.AuthConfig, 0, len(creds))
	for _, c := range creds {
		out = append(out, &runtimeapi.AuthConfig{
			Username: c.Username, Password: c.Password, Auth: c.Auth, ServerAddress: c.ServerAddress,
			IdentityToken: c.IdentityToken, RegistryToken: c.RegistryToken,
		})
	}
	return out, nil
}

// nodeKeyring reads the node's registry credentials (a docker config.json)
// at every pull, so a rotated file takes effect without a restart.
func (m *Manager) nodeKeyring() credentialprovider.DockerKeyring {
	kr := &credentialprovider.BasicDockerKeyring{}
	if m.cfg.NodeCredentials == "" {
		return kr
	}
	cfg, err := credentialprovider.ReadSpecificDockerConfigJSONFile(m.cfg.NodeCredentials)
	if err != nil {
		// Only the path: the error of a malformed file may quote it.
		m.log.Warn().Str("file", m.cfg.NodeCredentials).Msg("node registry credentials cannot be read; pulling without them")
		return kr
	}
	kr.Add(nil, cfg)
	return kr
}

// maxNodeImages is how many images the node status lists, as the kubelet's
// default nodeStatusMaxImages.
const maxNodeImages = 50

// NodeImages lists the images present, largest first (at most 50), as the
// kubelet puts them in the node's status.images.
func (m *Manager) NodeImages(ctx context.Context) ([]v1.ContainerImage, error) {
	svc, err := m.conn.get()
	if err != nil {
		return nil, err
	}
	images, err := svc.image.ListImages(quietContext(ctx), nil)
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	out := make([]v1.ContainerImage, 0, len(images))
	for _, img := range images {
		names := append(append([]string{}, img.RepoTags...), img.RepoDigests...)
		if len(names) == 0 {
			continue
		}
		out = append(out, v1.ContainerImage{Names: names, SizeBytes: int64(img.Size)})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].SizeBytes > out[j].SizeBytes })
	if len(out) > maxNodeImages {
		out = out[:maxNodeImages]
	}
	return out, nil
}
