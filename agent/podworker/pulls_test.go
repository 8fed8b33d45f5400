package podworker

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/cri"
)

func TestRetryFromPullWaits(t *testing.T) {
	pulling := &cri.ContainerError{Container: "a", Reason: "ContainerCreating", RetryAfter: 30 * time.Second, Err: errors.New("pulling")}
	backoff := &cri.ContainerError{Container: "b", Reason: "ImagePullBackOff", RetryAfter: 7 * time.Second, Err: errors.New("back-off")}
	other := &cri.ContainerError{Container: "c", Reason: "CreateContainerError", Err: errors.New("boom")}
	crash := &cri.BackoffError{Container: "d", Wait: 3 * time.Second}
	for _, tc := range []struct {
		err  error
		wait time.Duration
		ok   bool
	}{
		{nil, 0, false},
		{pulling, 30 * time.Second, true},
		{errors.Join(pulling, backoff), 7 * time.Second, true},
		{fmt.Errorf("sync: %w", errors.Join(pulling, crash)), 3*time.Second + 10*time.Millisecond, true},
		{errors.Join(pulling, other), 0, false}, // a real failure keeps the sync retry
		{crash, 0, false},                       // crash loops keep their own path
		{errors.New("runtime down"), 0, false},
	} {
		wait, ok := retryFrom(tc.err)
		if ok != tc.ok || ok && wait != tc.wait {
			t.Errorf("%v: got %v %v, want %v %v", tc.err, wait, ok, tc.wait, tc.ok)
		}
	}
}

func TestDefiniteFromPullRefusals(t *testing.T) {
	refused := &cri.ContainerError{Container: "a", Reason: "ErrImagePull", Definite: true, Err: errors.New("401 Unauthorized")}
	transient := &cri.ContainerError{Container: "b", Reason: "ErrImagePull", Err: errors.New("connection refused")}
	if got := definiteFrom(errors.Join(transient, fmt.Errorf("x: %w", refused))); !strings.Contains(got, "container a: ErrImagePull: 401 Unauthorized") {
		t.Errorf("definite %q", got)
	}
	if got := definiteFrom(transient); got != "" {
		t.Errorf("transient taken as definite: %q", got)
	}
	if got := definiteFrom(nil); got != "" {
		t.Errorf("nil: %q", got)
	}
}
