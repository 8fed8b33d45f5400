package validate

import (
	"fmt"
	"strings"
	"unicode/utf8"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Bounds on what one pod may ask for. They are generous for real pods and
// keep a hostile command from costing the agent much memory or time.
const (
	// MaxContainers bounds init, regular and ephemeral containers together.
	MaxContainers = 64
	// MaxEnvPerContainer bounds a container's env entries.
	MaxEnvPerContainer = 1024
	// MaxEnvFromPerContainer bounds a container's envFrom sources.
	MaxEnvFromPerContainer = 64
	// MaxVolumes bounds the pod's volumes.
	MaxVolumes = 256
	// MaxVolumeMountsPerContainer bounds a container's volumeMounts.
	MaxVolumeMountsPerContainer = 256

	// MaxExpandedValueBytes bounds every env value, command and arg after
	// $(VAR) expansion. The runtime enforces the same bound when it expands.
	MaxExpandedValueBytes = 32 << 10
	// MaxExpandedEnvBytes bounds a container's whole environment (names
	// plus expanded values) after expansion.
	MaxExpandedEnvBytes = 1 << 20
)

// valueFromPlaceholderLen is the length an env var from valueFrom counts
// with: its real value is known only when the pod runs, and counting it as
// one byte, not zero, keeps a chain of doubling references over it growing.
const valueFromPlaceholderLen = 1

// CheckBounds checks the counts above and simulates $(VAR) expansion of
// every container's env, command and args, with Kubernetes' semantics but
// on lengths only and stopping at the first value over its bound, so a pod
// whose env doubles through references is rejected without being expanded.
func CheckBounds(spec *v1.PodSpec) field.ErrorList {
	var errs field.ErrorList
	specPath := field.NewPath("spec")
	if n := len(spec.InitContainers) + len(spec.Containers) + len(spec.EphemeralContainers); n > MaxContainers {
		errs = append(errs, field.TooMany(specPath.Child("containers"), n, MaxContainers))
	}
	if len(spec.Volumes) > MaxVolumes {
		errs = append(errs, field.TooMany(specPath.Child("volumes"), len(spec.Volumes), MaxVolumes))
	}
	if len(errs) > 0 {
		return errs // too big to look into
	}
	visitContainers(spec, func(p *field.Path, c *v1.Container) {
		errs = append(errs, checkContainerBounds(p, c)...)
	})
	return errs
}

func checkContainerBounds(p *field.Path, c *v1.Container) field.ErrorList {
	var errs field.ErrorList
	if len(c.Env) > MaxEnvPerContainer {
		errs = append(errs, field.TooMany(p.Child("env"), len(c.Env), MaxEnvPerContainer))
	}
	if len(c.EnvFrom) > MaxEnvFromPerContainer {
		errs = append(errs, field.TooMany(p.Child("envFrom"), len(c.EnvFrom), MaxEnvFromPerContainer))
	}
	if len(c.VolumeMounts) > MaxVolumeMountsPerContainer {
		errs = append(errs, field.TooMany(p.Child("volumeMounts"), len(c.VolumeMounts), MaxVolumeMountsPerContainer))
	}
	if len(errs) > 0 {
		return errs
	}
	return checkExpansion(p, c)
}

// checkExpansion follows the kubelet: env entries in order, each non-empty
// value expanded with the entries before it (a later entry of the same name
// replaces an earlier one); then command and args with the final env.
// Names from envFrom are unknown here and so stay unexpanded, as their
// literal "$(NAME)".
func checkExpansion(p *field.Path, c *v1.Container) field.ErrorList {
	overValue := func(fp *field.Path) field.ErrorList {
		return field.ErrorList{field.Forbidden(fp, fmt.Sprintf("expands to more than %d bytes (MaxExpandedValueBytes)", MaxExpandedValueBytes))}
	}
	vars := make(map[string]int, len(c.Env))
	total := 0
	for i, e := range c.Env {
		n := 0
		switch {
		case e.Value != "":
			var ok bool
			if n, ok = expandedLen(e.Value, vars, MaxExpandedValueBytes); !ok {
				return overValue(p.Child("env").Index(i).Child("value"))
			}
		case e.ValueFrom != nil:
			n = valueFromPlaceholderLen
		}
		if old, ok := vars[e.Name]; ok {
			total -= len(e.Name) + old
		}
		vars[e.Name] = n
		total += len(e.Name) + n
		if total > MaxExpandedEnvBytes {
			return field.ErrorList{field.Forbidden(p.Child("env").Index(i),
				fmt.Sprintf("environment expands to more than %d bytes (MaxExpandedEnvBytes)", MaxExpandedEnvBytes))}
		}
	}
	var errs field.ErrorList
	for i, s := range c.Command {
		if _, ok := expandedLen(s, vars, MaxExpandedValueBytes); !ok {
			errs = append(errs, overValue(p.Child("command").Index(i))...)
		}
	}
	for i, s := range c.Args {
		if _, ok := expandedLen(s, vars, MaxExpandedValueBytes); !ok {
			errs = append(errs, overValue(p.Child("args").Index(i))...)
		}
	}
	return errs
}

// expandedLen is the length of expansion.Expand(s, mapping) from
// k8s.io/kubernetes/third_party/forked/golang/expansion, where mapping
// gives the lengths in vars and leaves unknown names as "$(name)". It stops
// and reports false as soon as the length passes limit.
func expandedLen(s string, vars map[string]int, limit int) (int, bool) {
	n, checkpoint := 0, 0
	for cursor := 0; cursor < len(s); cursor++ {
		if s[cursor] != '$' || cursor+1 >= len(s) {
			continue
		}
		n += cursor - checkpoint
		rest := s[cursor+1:]
		r, size := utf8.DecodeRuneInString(rest)
		advance := size
		switch r {
		case '$': // "$$" is an escaped "$"
			n += size
		case '(':
			if end := strings.IndexByte(rest[1:], ')'); end < 0 {
				n += 2 // an unclosed "$(" is kept as is
				advance = 1
			} else {
				name := rest[1 : end+1]
				if l, ok := vars[name]; ok {
					n += l
				} else {
					n += len(name) + 3 // "$(name)"
				}
				advance = end + 2
			}
		default: // "$x" is kept; an invalid byte becomes U+FFFD
			n += 1 + utf8.RuneLen(r)
		}
		cursor += advance
		checkpoint = cursor + 1
		if n > limit {
			return n, false
		}
	}
	n += len(s) - checkpoint
	return n, n <= limit
}
