package apiv1

// This file holds the rollout document: the retained JSON that mqletctl
// keeps on <prefix>/rollouts/<id> while it rolls manifests out to a fleet
// in waves (docs/fleet.md). Any dashboard reads it; any mqletctl resumes,
// watches or aborts the rollout from it.

import (
	"errors"
	"fmt"
	"time"
)

// RolloutLevel is the topic level under the prefix that holds rollout
// documents (<prefix>/rollouts/<id>); no node may be named so.
const RolloutLevel = "rollouts"

// MaxRolloutDocBytes bounds a rollout document a reader accepts (the
// manifest, the previous manifests and one entry per node).
const MaxRolloutDocBytes = 8 << 20

// RolloutTopic is the retained document of rollout id.
func RolloutTopic(prefix, id string) string {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return prefix + "/" + RolloutLevel + "/" + id
}

// RolloutAbortTopic is where an abort of rollout id is asked for (a
// retained RolloutAbort), so the process running it stops it.
func RolloutAbortTopic(prefix, id string) string { return RolloutTopic(prefix, id) + "/abort" }

// ValidateRolloutID accepts what a request id accepts, except the names
// of the levels under a rollout's topic.
func ValidateRolloutID(id string) error {
	if err := ValidateRequestID(id); err != nil {
		return fmt.Errorf("rollout id: %w", err)
	}
	return nil
}

// Phases of a rollout.
const (
	RolloutRunning = "Running"
	// RolloutSucceeded: every node finished and the failures stayed within
	// the abort criteria.
	RolloutSucceeded = "Succeeded"
	// RolloutAborted: an abort criterion was met (or an operator aborted);
	// no new wave was sent, and with rollback the nodes already changed
	// got their previous manifests back.
	RolloutAborted = "Aborted"
)

// Phases of one node in a rollout.
const (
	// NodePending: not sent yet (its wave has not come, or it is offline).
	NodePending = "Pending"
	// NodeSent: the command was published; no answer yet.
	NodeSent = "Sent"
	// NodeApplied: the node stored the rollout's manifests (accepted) and
	// works on them; its per-node timeout runs.
	NodeApplied = "Applied"
	// NodeSucceeded: the node answered succeeded and every pod of the
	// manifests is Ready in its retained status.
	NodeSucceeded = "Succeeded"
	// NodeFailed: refused, failed, or not Ready within the node timeout.
	NodeFailed = "Failed"
	// NodeCancelled: never sent; the rollout was aborted first.
	NodeCancelled = "Cancelled"
	// NodeRollingBack: its previous manifests were sent back.
	NodeRollingBack = "RollingBack"
	// NodeRolledBack: the node holds its previous manifests again.
	NodeRolledBack = "RolledBack"
	// NodeRollbackFailed: the node refused its previous manifests.
	NodeRollbackFailed = "RollbackFailed"
)

// Rollout is the retained document of one rollout.
type Rollout struct {
	ID string `json:"id"`
	// Target is what the nodes were chosen by, at the start; Nodes is
	// then fixed.
	Target   RolloutTarget   `json:"target"`
	Strategy RolloutStrategy `json:"strategy"`
	// Manifest is what every node gets (YAML or JSON, as given).
	Manifest string `json:"manifest"`
	// Objects are the objects the manifest names.
	Objects []ObjectRef `json:"objects"`
	Phase   string      `json:"phase"`
	// Reason says why the rollout ended as it did (or why it waits).
	Reason string `json:"reason,omitempty"`
	// Wave is the latest wave sent (1-based; 0 before the first).
	Wave   int           `json:"wave"`
	Totals RolloutTotals `json:"totals"`
	Nodes  []RolloutNode `json:"nodes"`
	// Previous holds what nodes ran before, by digest (RolloutNode.
	// Previous): the manifest of every object of Objects the node held
	// (one YAML document each), so nodes that ran the same share one entry.
	Previous map[string]string `json:"previous,omitempty"`
	// Runner is the mqletctl process that runs the rollout; it renews
	// RenewedAt while it does.
	Runner    RolloutRunner `json:"runner"`
	CreatedAt time.Time     `json:"createdAt"`
	UpdatedAt time.Time     `json:"updatedAt"`
	// Rev grows with every publication of the document.
	Rev uint64 `json:"rev"`
	// Signature, when the runner signs commands (--sign-key), is its
	// Ed25519 signature of the document's JSON with Signature left out;
	// a resume that signs commands sends only what a trusted key signed.
	Signature *RolloutSignature `json:"signature,omitempty"`
}

// RolloutSignature signs a rollout document.
type RolloutSignature struct {
	KeyID string `json:"keyId"`
	Sig   []byte `json:"sig"` // base64 in JSON
}

// RolloutTarget says how the nodes were chosen: the members of a group
// or the nodes whose labels match a selector.
type RolloutTarget struct {
	Group    string `json:"group,omitempty"`
	Selector string `json:"selector,omitempty"`
}

// RolloutStrategy is how the waves are cut and when the rollout aborts.
type RolloutStrategy struct {
	// Batch nodes in the first wave, or BatchPercent of the nodes
	// (rounded up, at least one); one of them is set.
	Batch        int `json:"batch,omitempty"`
	BatchPercent int `json:"batchPercent,omitempty"`
	// Growth multiplies each wave's size by this factor (1: equal waves).
	Growth float64 `json:"growth,omitempty"`
	// MaxFailures aborts when more nodes failed; MaxFailurePercent, when
	// set (> 0), aborts when more than this share of the finished nodes
	// failed, once MinExecuted nodes finished.
	MaxFailures       int `json:"maxFailures"`
	MaxFailurePercent int `json:"maxFailurePercent,omitempty"`
	MinExecuted       int `json:"minExecuted,omitempty"`
	// NodeTimeoutSeconds: a node not Ready this long after it answered
	// accepted (time offline not counted) has failed.
	NodeTimeoutSeconds int64 `json:"nodeTimeoutSeconds"`
	// Rollback re-applies the previous manifests to the nodes already
	// changed when the rollout aborts.
	Rollback bool `json:"rollback,omitempty"`
}

// RolloutTotals count the nodes by where they are; Targeted is the sum of
// Pending, Succeeded, Failed, Cancelled, RolledBack and the two rollback
// phases counted apart (RollingBack, RollbackFailed).
type RolloutTotals struct {
	Targeted int `json:"targeted"`
	// Applied: nodes that hold the rollout's manifests now (answered
	// accepted, not rolled back): Applied, Succeeded and Failed after
	// accepted.
	Applied        int `json:"applied"`
	Succeeded      int `json:"succeeded"`
	Failed         int `json:"failed"`
	Pending        int `json:"pending"`
	Cancelled      int `json:"cancelled,omitempty"`
	RollingBack    int `json:"rollingBack,omitempty"`
	RolledBack     int `json:"rolledBack,omitempty"`
	RollbackFailed int `json:"rollbackFailed,omitempty"`
	// Offline: pending nodes whose retained state says offline.
	Offline int `json:"offline,omitempty"`
}

// RolloutNode is one node's part in a rollout.
type RolloutNode struct {
	Node  string `json:"node"`
	Wave  int    `json:"wave"`
	Phase string `json:"phase"`
	// Message is the node's own word (its reply) or the rollout's (timed
	// out, offline since).
	Message string `json:"message,omitempty"`
	// OfflineSince is set while the node's retained state says offline.
	OfflineSince *time.Time `json:"offlineSince,omitempty"`
	// RequestID is the latest command sent to the node; Answer its final
	// phase (succeeded or failed), "" while it has none.
	RequestID string `json:"requestId,omitempty"`
	Answer    string `json:"answer,omitempty"`
	// Changed: the node stored the rollout's manifests at least once (so
	// a rollback concerns it).
	Changed bool `json:"changed,omitempty"`
	// PreviousKnown: Previous was read from the node before its first
	// command; Previous is the digest of what it held ("" for nothing).
	PreviousKnown bool   `json:"previousKnown,omitempty"`
	Previous      string `json:"previous,omitempty"`
	// Absent are the objects of the manifest the node did not hold
	// before: a rollback deletes them.
	Absent     []ObjectRef `json:"absent,omitempty"`
	SentAt     *time.Time  `json:"sentAt,omitempty"`
	AcceptedAt *time.Time  `json:"acceptedAt,omitempty"`
	// Deadline is when the node has failed if it is not Ready (AcceptedAt
	// plus the node timeout, moved on by the time it spent offline).
	Deadline   *time.Time `json:"deadline,omitempty"`
	FinishedAt *time.Time `json:"finishedAt,omitempty"`
	// Pods are the pods of the manifest as the node stored them (uid and
	// generation from its accepted reply).
	Pods []RolloutPod `json:"pods,omitempty"`
}

// RolloutPod is one pod a node stored for the rollout.
type RolloutPod struct {
	Namespace  string `json:"namespace"`
	Name       string `json:"name"`
	UID        string `json:"uid,omitempty"`
	Generation int64  `json:"generation,omitempty"`
	Ready      bool   `json:"ready"`
}

// RolloutRunner names the process running a rollout.
type RolloutRunner struct {
	ID        string    `json:"id,omitempty"`
	RenewedAt time.Time `json:"renewedAt,omitempty"`
}

// RolloutAbort is the retained request to abort a rollout.
type RolloutAbort struct {
	Reason   string    `json:"reason"`
	Rollback bool      `json:"rollback,omitempty"`
	At       time.Time `json:"at"`
}

// Validate checks a decoded rollout document enough to run it: its id,
// phase and nodes (names, no repeats, known phases).
func (r *Rollout) Validate() error {
	if err := ValidateRolloutID(r.ID); err != nil {
		return err
	}
	switch r.Phase {
	case RolloutRunning, RolloutSucceeded, RolloutAborted:
	default:
		return fmt.Errorf("rollout %s: unknown phase %q", r.ID, bounded(r.Phase))
	}
	if len(r.Nodes) == 0 {
		return fmt.Errorf("rollout %s: no nodes", r.ID)
	}
	seen := map[string]bool{}
	for _, n := range r.Nodes {
		if err := ValidateNodeName(n.Node); err != nil {
			return fmt.Errorf("rollout %s: %w", r.ID, err)
		}
		if seen[n.Node] {
			return fmt.Errorf("rollout %s: node %s twice", r.ID, n.Node)
		}
		seen[n.Node] = true
		switch n.Phase {
		case NodePending, NodeSent, NodeApplied, NodeSucceeded, NodeFailed, NodeCancelled, NodeRollingBack, NodeRolledBack, NodeRollbackFailed:
		default:
			return fmt.Errorf("rollout %s: node %s: unknown phase %q", r.ID, n.Node, bounded(n.Phase))
		}
		if n.Previous != "" {
			if _, ok := r.Previous[n.Previous]; !ok {
				return fmt.Errorf("rollout %s: node %s: previous %q not in the document", r.ID, n.Node, bounded(n.Previous))
			}
		}
	}
	if r.Manifest == "" {
		return errors.New("rollout " + r.ID + ": no manifest")
	}
	return nil
}
