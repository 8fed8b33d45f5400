package apiv1

import "encoding/json"

// Command verbs: the last level but one of <prefix>/<node>/cmd/<verb>[/<id>].
const (
	VerbApply   = "apply"
	VerbDelete  = "delete"
	VerbSync    = "sync"
	VerbGet     = "get"
	VerbRestart = "restart"
	VerbLogs    = "logs"
	VerbExec    = "exec"
	VerbConfig  = "config"
	VerbCancel  = "cancel"
)

// Verbs lists every verb of the contract, in the order the docs show them.
// An agent may not implement all of them yet; it answers those failed.
func Verbs() []string {
	return []string{VerbApply, VerbDelete, VerbSync, VerbGet, VerbRestart, VerbLogs, VerbExec, VerbConfig, VerbCancel}
}

// apply and sync take Kubernetes manifests (a Pod, ConfigMap or Secret, a
// List, or multi-document YAML) as their payload; their accepted reply
// carries one ChangeResult per stored change.

// ChangeResult is one stored change, as the accepted reply of apply, sync
// reports it (never an object's content, so no secret value is echoed).
type ChangeResult struct {
	Kind       string `json:"kind"`
	Key        string `json:"key"` // namespace/name
	Action     string `json:"action"`
	UID        string `json:"uid,omitempty"`
	Generation int64  `json:"generation,omitempty"`
}

// DeleteRequest is the short form of a delete payload (a delete may also
// carry full manifests, whose objects are named by their metadata).
type DeleteRequest struct {
	Kind               string `json:"kind"`
	Namespace          string `json:"namespace,omitempty"`
	Name               string `json:"name"`
	GracePeriodSeconds *int64 `json:"gracePeriodSeconds,omitempty"`
}

// RestartRequest restarts a pod (every container and the sandbox) or, with
// Container, that one container.
type RestartRequest struct {
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	Container string `json:"container,omitempty"`
}

// RestartResult names the containers started again.
type RestartResult struct {
	Containers []RestartedContainer `json:"containers"`
}

// RestartedContainer is one container of a RestartResult.
type RestartedContainer struct {
	Name         string `json:"name"`
	ContainerID  string `json:"containerID"`
	RestartCount int32  `json:"restartCount"`
}

// LogsRequest reads a container's log, like kubectl logs.
type LogsRequest struct {
	Namespace     string `json:"namespace,omitempty"`
	Name          string `json:"name"`
	Container     string `json:"container,omitempty"`
	TailLines     *int64 `json:"tailLines,omitempty"`
	SinceSeconds  *int64 `json:"sinceSeconds,omitempty"`
	SinceTime     string `json:"sinceTime,omitempty"` // RFC 3339
	LimitBytes    *int64 `json:"limitBytes,omitempty"`
	Previous      bool   `json:"previous,omitempty"`
	Timestamps    bool   `json:"timestamps,omitempty"`
	Follow        bool   `json:"follow,omitempty"`
	FollowSeconds int64  `json:"followSeconds,omitempty"`
}

// LogsChunk is the result of one in_progress reply of logs: the next lines,
// in order (the reply's Seq numbers the chunks from 1).
type LogsChunk struct {
	Lines []string `json:"lines"`
}

// LogsResult is the result of the final reply of logs: the lines when they
// fit in it, else only the totals of the chunks sent before.
type LogsResult struct {
	Lines     []string `json:"lines,omitempty"`
	Chunks    int      `json:"chunks,omitempty"`
	LineCount int      `json:"lineCount"`
	Bytes     int64    `json:"bytes"`
	// Truncated: limitBytes or the byte-rate cap cut the output.
	Truncated bool `json:"truncated,omitempty"`
	// Ended says why a follow stopped: followSeconds, containerExited,
	// cancelled, or unread (its requester sent nothing on the request's
	// input topic for logs.unreadTimeout).
	Ended string `json:"ended,omitempty"`
}

// ExecRequest runs a command in a container (only when exec is enabled in
// the agent's configuration).
type ExecRequest struct {
	Namespace      string   `json:"namespace,omitempty"`
	Name           string   `json:"name"`
	Container      string   `json:"container,omitempty"`
	Command        []string `json:"command"`
	TimeoutSeconds int64    `json:"timeoutSeconds,omitempty"`
	Stdin          string   `json:"stdin,omitempty"`
	// Interactive runs the command with a terminal and stdin attached
	// (mqletctl exec -it): its terminal is carried on the request's
	// input and output topics (ShellInput, ShellOutput) until it exits;
	// TimeoutSeconds, Stdin and the output bounds do not apply, the
	// node's idle timeout does.
	Interactive bool `json:"interactive,omitempty"`
	// Size is the terminal's first size (interactive only).
	Size *TermSize `json:"size,omitempty"`
	// InputKey (interactive only; required when the command is signed) is
	// a random ShellKeyBytes key sealed to the node (package sealing,
	// bound to namespace ShellKeyNamespace, name = the request id, key
	// ShellKeyName): every ShellInput then carries its MAC
	// (ShellInputMAC), so only the signer's session can type into it.
	InputKey []byte `json:"inputKey,omitempty"`
}

// ExecResult is the result of the final reply of exec.
type ExecResult struct {
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	ExitCode        int32  `json:"exitCode"`
	StdoutTruncated bool   `json:"stdoutTruncated,omitempty"`
	StderrTruncated bool   `json:"stderrTruncated,omitempty"`
}

// ConfigPatch is the payload of config: a JSON merge patch (RFC 7386) of
// the live-tunable settings, keyed by their names in the configuration
// file; null resets a key to the file's value.
type ConfigPatch map[string]json.RawMessage

// Sources of a ConfigValue.
const (
	SourceDefault = "default"
	SourceFile    = "file"
	SourceEnv     = "env"
	SourceFlag    = "flag"
	SourceRemote  = "remote"
)

// ConfigView is the result of config and of get {"kind":"Config"}: the
// effective value of each setting and where it came from.
type ConfigView struct {
	Settings map[string]ConfigValue `json:"settings"`
}

// ConfigValue is one setting of a ConfigView.
type ConfigValue struct {
	Value  json.RawMessage `json:"value"`
	Source string          `json:"source"`
}

// CancelRequest stops a running request (a logs follow).
type CancelRequest struct {
	RequestID string `json:"requestId"`
}

// CancelResult names the request that was stopped.
type CancelResult struct {
	RequestID string `json:"requestId"`
	Verb      string `json:"verb,omitempty"`
}
