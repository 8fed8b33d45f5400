package config

import (
	"path/filepath"
	"time"

	"github.com/mqlet/mqlet/internal/imagepolicy"
)

// Images is how images are pulled: how many pulls run at once, how long one
// may take, how failed pulls back off (per image, shared by the pods using
// it, as the kubelet's 10 s doubling to 300 s) and the node's own registry
// credentials.
type Images struct {
	// PullParallelism bounds the pulls running at once; a pull never holds
	// up the syncs of other pods.
	PullParallelism int `json:"pullParallelism"`
	// PullTimeout bounds one pull (all its layers).
	PullTimeout     Duration `json:"pullTimeout"`
	PullBackoffBase Duration `json:"pullBackoffBase"`
	PullBackoffMax  Duration `json:"pullBackoffMax"`
	// CredentialsFile is a docker config.json ({"auths": {...}}) with the
	// node's registry credentials, tried after a pod's imagePullSecrets and
	// matched by registry the same way. Read at every pull; never published
	// or logged. Empty: none.
	CredentialsFile string `json:"credentialsFile"`
	// PreloadDir holds image tarballs (OCI or docker save; .tar, .tar.gz,
	// .tgz) imported into containerd at start and whenever one appears or
	// changes, with a node event per import. Empty: off.
	PreloadDir string `json:"preloadDir"`
	// PreloadInterval is how often PreloadDir is rescanned.
	PreloadInterval Duration `json:"preloadInterval"`
	// Ctr is containerd's ctr binary, which does the import (CRI has none).
	Ctr string `json:"ctr"`
	// AllowedRegistries are the registries images may come from, checked at
	// admission before any connection: "*" is any registry that is not the
	// node itself (loopback, link-local, unspecified, the node's own
	// addresses, localhost), a host or host:port allows that registry even
	// when local, "*.domain" the hosts below domain. Without "*" only the
	// listed ones. A name allowed by "*" is resolved just before its pull
	// and refused if it resolves to a local address.
	AllowedRegistries []string `json:"allowedRegistries"`
}

func defaultImages() Images {
	return Images{
		PullParallelism: 2,
		PullTimeout:     Duration{10 * time.Minute},
		PullBackoffBase: Duration{10 * time.Second},
		PullBackoffMax:  Duration{300 * time.Second},
		PreloadInterval: Duration{10 * time.Second},
		Ctr:             "ctr",
		// Copied: a caller changing its config must not change the default.
		AllowedRegistries: append([]string(nil), imagepolicy.Default...),
	}
}

func (im *Images) validate(bad func(field, format string, args ...any)) {
	if im.PullParallelism < 1 || im.PullParallelism > 16 {
		bad("images.pullParallelism", "must be between 1 and 16, got %d", im.PullParallelism)
	}
	if im.PullTimeout.Duration <= 0 {
		bad("images.pullTimeout", "must be positive")
	}
	if im.PullBackoffBase.Duration <= 0 {
		bad("images.pullBackoffBase", "must be positive")
	}
	if im.PullBackoffMax.Duration < im.PullBackoffBase.Duration {
		bad("images.pullBackoffMax", "must be at least images.pullBackoffBase")
	}
	if im.CredentialsFile != "" && !filepath.IsAbs(im.CredentialsFile) {
		bad("images.credentialsFile", "must be an absolute path")
	}
	if im.PreloadDir != "" && !filepath.IsAbs(im.PreloadDir) {
		bad("images.preloadDir", "must be an absolute path")
	}
	if im.PreloadInterval.Duration <= 0 {
		bad("images.preloadInterval", "must be positive")
	}
	if len(im.AllowedRegistries) == 0 {
		bad("images.allowedRegistries", `must list at least one registry pattern ("*": any that is not the node itself)`)
	} else if _, err := imagepolicy.New(im.AllowedRegistries); err != nil {
		bad("images.allowedRegistries", "%v", err)
	}
	if im.Ctr == "" {
		bad("images.ctr", "must name the ctr binary")
	}
}
