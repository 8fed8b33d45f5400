package podworker

import (
	"errors"
	"time"

	"github.com/mqlet/mqlet/agent/podstatus"
	"github.com/mqlet/mqlet/cri"
)

// waitingFrom turns a sync error into the waiting reason of each container
// it concerns (a sync can fail for several containers at once).
func waitingFrom(err error) map[string]podstatus.Waiting {
	if err == nil {
		return nil
	}
	out := map[string]podstatus.Waiting{}
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case *cri.BackoffError:
			out[e.Container] = podstatus.Waiting{Reason: podstatus.ReasonCrashLoopBackOff, Message: e.Error()}
			return
		case *cri.ContainerError:
			out[e.Container] = podstatus.Waiting{Reason: e.Reason, Message: e.Error()}
			return
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				walk(inner)
			}
			return
		}
		if inner := errors.Unwrap(err); inner != nil {
			walk(inner)
		}
	}
	walk(err)
	return out
}

// retryFrom returns the soonest RetryAfter of a sync error when every
// failure in it carries one (pulls in flight or backing off) or is a
// crash-loop wait; ok is false when some failure needs the sync retry.
func retryFrom(err error) (wait time.Duration, ok bool) {
	if err == nil {
		return 0, false
	}
	found, all := false, true
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case *cri.BackoffError:
			if !found || e.Wait < wait {
				wait = e.Wait + 10*time.Millisecond
			}
			found = true
			return
		case *cri.ContainerError:
			if e.RetryAfter <= 0 {
				all = false
				return
			}
			if !found || e.RetryAfter < wait {
				wait = e.RetryAfter
			}
			found = true
			return
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				walk(inner)
			}
			return
		}
		if inner := errors.Unwrap(err); inner != nil {
			walk(inner)
			return
		}
		all = false
	}
	walk(err)
	var ce *cri.ContainerError
	if !errors.As(err, &ce) {
		return 0, false // crash-loop waits alone keep their own path
	}
	return wait, found && all
}

// definiteFrom returns the message of the first container error in err
// that no retry cures, or "".
func definiteFrom(err error) string {
	var msg string
	var walk func(error)
	walk = func(err error) {
		if msg != "" || err == nil {
			return
		}
		switch e := err.(type) {
		case *cri.ContainerError:
			if e.Definite {
				msg = "container " + e.Container + ": " + e.Reason + ": " + e.Err.Error()
			}
			return
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				walk(inner)
			}
			return
		}
		walk(errors.Unwrap(err))
	}
	walk(err)
	return msg
}
