package config

import (
	"path/filepath"
	"time"
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
}

func defaultImages() Images {
	return Images{
		PullParallelism: 2,
		PullTimeout:     Duration{10 * time.Minute},
		PullBackoffBase: Duration{10 * time.Second},
		PullBackoffMax:  Duration{300 * time.Second},
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
}
