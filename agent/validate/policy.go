package validate

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/pod-security-admission/api"

	"github.com/mqlet/mqlet/internal/imagepolicy"
)

// Profile is a Pod Security Standards level.
type Profile string

// The three Pod Security Standards profiles.
const (
	ProfilePrivileged Profile = "privileged"
	ProfileBaseline   Profile = "baseline"
	ProfileRestricted Profile = "restricted"
)

// DefaultProfile applies when a Policy names none.
const DefaultProfile = ProfileBaseline

// ParseProfile accepts "privileged", "baseline" or "restricted".
func ParseProfile(s string) (Profile, error) {
	switch p := Profile(s); p {
	case ProfilePrivileged, ProfileBaseline, ProfileRestricted:
		return p, nil
	}
	return "", fmt.Errorf("unknown Pod Security profile %q: want privileged, baseline or restricted", s)
}

// Allows reports whether p admits everything q admits and more: privileged
// allows more than baseline, baseline more than restricted. An unknown
// profile allows nothing more than any other.
func (p Profile) Allows(q Profile) bool { return profileRank(p) > profileRank(q) }

func profileRank(p Profile) int {
	switch p {
	case ProfilePrivileged:
		return 3
	case ProfileBaseline:
		return 2
	case ProfileRestricted:
		return 1
	}
	return 0
}

// LoosenedFor is the policy for a pod in namespace of a command signed by a
// key granted the given profile: p itself unless that profile allows more
// than the namespace's own, then p judged at the key's profile. A key's
// profile never tightens what the node allows an unsigned command.
func (p Policy) LoosenedFor(namespace string, granted Profile) Policy {
	if !granted.Allows(p.ProfileFor(namespace)) {
		return p
	}
	return p.WithProfile(granted)
}

// PortRange is an inclusive range of host ports; a single port has First == Last.
type PortRange struct{ First, Last int32 }

// ParsePortRange accepts "8080" or "30000-32767" (ports 1 to 65535).
func ParsePortRange(s string) (PortRange, error) {
	lo, hi, isRange := strings.Cut(s, "-")
	first, err := parsePort(lo)
	if err != nil {
		return PortRange{}, fmt.Errorf("host port range %q: %w", s, err)
	}
	last := first
	if isRange {
		if last, err = parsePort(hi); err != nil {
			return PortRange{}, fmt.Errorf("host port range %q: %w", s, err)
		}
	}
	if last < first {
		return PortRange{}, fmt.Errorf("host port range %q: end below start", s)
	}
	return PortRange{First: first, Last: last}, nil
}

func parsePort(s string) (int32, error) {
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("%q is not a port from 1 to 65535", s)
	}
	return int32(n), nil
}

func (r PortRange) String() string {
	if r.First == r.Last {
		return strconv.Itoa(int(r.First))
	}
	return fmt.Sprintf("%d-%d", r.First, r.Last)
}

// MarshalText writes "8080" or "30000-32767".
func (r PortRange) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText reads what ParsePortRange accepts.
func (r *PortRange) UnmarshalText(b []byte) error {
	v, err := ParsePortRange(string(b))
	if err != nil {
		return err
	}
	*r = v
	return nil
}

// Policy is the node's admission policy: pods are checked against a Pod
// Security Standards profile (node-wide, overridable per namespace), and
// the exceptions below waive single PSS findings for the named fields only.
// The zero value is the baseline profile with no exceptions.
type Policy struct {
	// Profile is the node-wide profile; "" means DefaultProfile (baseline).
	Profile Profile `json:"profile,omitempty" yaml:"profile,omitempty"`
	// Namespaces overrides Profile for the pods of a namespace.
	Namespaces map[string]Profile `json:"namespaces,omitempty" yaml:"namespaces,omitempty"`

	AllowPrivileged  bool `json:"allowPrivileged" yaml:"allowPrivileged"`
	AllowHostNetwork bool `json:"allowHostNetwork" yaml:"allowHostNetwork"`
	AllowHostPID     bool `json:"allowHostPID" yaml:"allowHostPID"`
	AllowHostIPC     bool `json:"allowHostIPC" yaml:"allowHostIPC"`
	// AllowedHostPaths are absolute directory prefixes; a hostPath volume is
	// allowed only if its path, cleaned and with symlinks resolved, is one of
	// them or lies beneath one.
	AllowedHostPaths []string `json:"allowedHostPaths,omitempty" yaml:"allowedHostPaths,omitempty"`
	// AllowedCapabilities may be added to containers ("NET_ADMIN" or
	// "CAP_NET_ADMIN"; "ALL" only if listed itself).
	AllowedCapabilities []string `json:"allowedCapabilities,omitempty" yaml:"allowedCapabilities,omitempty"`
	// AllowedHostPorts are the host ports containers may bind; every other
	// hostPort is denied, as PSS baseline does.
	AllowedHostPorts []PortRange `json:"allowedHostPorts,omitempty" yaml:"allowedHostPorts,omitempty"`

	// Host is what the node's kernel enforces (not configured: detected at
	// start); the zero value enforces neither AppArmor nor SELinux.
	Host HostSecurity `json:"-" yaml:"-"`
	// Registries are the registries images may come from
	// (images.allowedRegistries); nil allows imagepolicy.Default. No
	// signing key's profile loosens them.
	Registries *imagepolicy.Policy `json:"-" yaml:"-"`
}

// ProfileFor is the profile pods of namespace are checked against. A
// profile that is not one of the three (config validation prevents it)
// fails closed, as restricted.
func (p Policy) ProfileFor(namespace string) Profile {
	prof := p.Profile
	if ns, ok := p.Namespaces[namespace]; ok && ns != "" {
		prof = ns
	}
	if prof == "" {
		return DefaultProfile
	}
	if _, err := ParseProfile(string(prof)); err != nil {
		return ProfileRestricted
	}
	return prof
}

// WithProfile returns a copy that checks every pod, whatever its namespace,
// against profile (e.g. one a signed command's key was granted); the
// exceptions are kept.
func (p Policy) WithProfile(profile Profile) Policy {
	c := p
	c.Profile = profile
	c.Namespaces = nil
	return c
}

// Check returns one Forbidden error per finding, each with its field path:
// the Pod Security Standards findings of the pod's profile not waived by an
// exception, then what mqlet cannot honour at any profile (see checkNode).
// meta is the pod's (defaulted) metadata; its namespace selects the profile.
func (p Policy) Check(meta *metav1.ObjectMeta, spec *v1.PodSpec) field.ErrorList {
	errs := p.checkPodSecurity(meta, spec)
	errs = append(errs, p.checkRegistries(spec)...)
	return append(errs, checkNode(meta, spec, p.Host)...)
}

// checkRegistries refuses an image whose registry is not allowed, before
// anything connects to it.
func (p Policy) checkRegistries(spec *v1.PodSpec) field.ErrorList {
	var errs field.ErrorList
	for _, list := range []struct {
		name       string
		containers []v1.Container
	}{{"initContainers", spec.InitContainers}, {"containers", spec.Containers}} {
		for i, c := range list.containers {
			if err := p.Registries.Check(c.Image); err != nil && errors.Is(err, imagepolicy.ErrNotAllowed) {
				errs = append(errs, field.Forbidden(field.NewPath("spec", list.name).Index(i).Child("image"), err.Error()))
			}
		}
	}
	return errs
}

func (p Policy) checkPodSecurity(meta *metav1.ObjectMeta, spec *v1.PodSpec) field.ErrorList {
	profile := p.ProfileFor(meta.Namespace)
	if profile == ProfilePrivileged {
		return nil
	}
	waived, hostPathNotes := p.waive(spec)
	lv := api.LevelVersion{Level: api.Level(profile), Version: api.LatestVersion()}
	var errs field.ErrorList
	for _, f := range evaluatePodSecurity(lv.Level, meta, waived) {
		v := Violation{Profile: lv.String(), Reason: f.result.ForbiddenReason, Control: f.result.ForbiddenReason}
		if f.result.ForbiddenDetail != "" {
			v.Control += " (" + f.result.ForbiddenDetail + ")"
		}
		paths := locate(f.id, meta, waived)
		if len(paths) == 0 {
			paths = []*field.Path{field.NewPath("spec")} // never drop a finding for want of a path
		}
		for _, path := range paths {
			e := field.Forbidden(path, v.String())
			if note, ok := hostPathNotes[path.String()]; ok {
				e.Detail += "; " + note
			}
			e.BadValue = v // Forbidden errors do not print their value
			errs = append(errs, e)
		}
	}
	return errs
}

// Violation is one failed Pod Security Standards control, as kubectl
// prints it in a PodSecurity warning. Policy.Check puts it in the BadValue
// of each of the control's Forbidden errors.
type Violation struct {
	Profile string // "baseline:latest"
	Reason  string // "privileged"
	Control string // `privileged (container "c" must not set securityContext.privileged=true)`
}

func (v Violation) header() string { return fmt.Sprintf("violates PodSecurity %q: ", v.Profile) }

func (v Violation) String() string { return v.header() + v.Control }

// waive returns a copy of spec with every field an exception allows made
// harmless (host namespace off, privileged unset, an allowed capability
// replaced by NET_BIND_SERVICE, an allowed hostPort zeroed, an allowed
// hostPath turned into an emptyDir), so the PSS checks judge only what is
// left. List positions are kept, so field paths still match the pod.
// The notes explain, per hostPath field path, why a hostPath stayed denied.
func (p Policy) waive(spec *v1.PodSpec) (*v1.PodSpec, map[string]string) {
	w := spec.DeepCopy()
	w.HostNetwork = w.HostNetwork && !p.AllowHostNetwork
	w.HostPID = w.HostPID && !p.AllowHostPID
	w.HostIPC = w.HostIPC && !p.AllowHostIPC
	notes := map[string]string{}
	for i := range w.Volumes {
		hp := w.Volumes[i].HostPath
		if hp == nil {
			continue
		}
		ok, why := p.hostPathAllowed(hp.Path)
		if ok {
			w.Volumes[i].VolumeSource = v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}
			continue
		}
		notes[field.NewPath("spec", "volumes").Index(i).Child("hostPath", "path").String()] = why
	}
	visit := func(c *v1.Container) {
		for j := range c.Ports {
			if c.Ports[j].HostPort != 0 && p.hostPortAllowed(c.Ports[j].HostPort) {
				c.Ports[j].HostPort = 0
			}
		}
		sc := c.SecurityContext
		if sc == nil {
			return
		}
		if p.AllowPrivileged {
			sc.Privileged = nil
		}
		if sc.Capabilities != nil {
			for j, capability := range sc.Capabilities.Add {
				if p.capabilityAllowed(string(capability)) {
					// NET_BIND_SERVICE passes both baseline and restricted.
					sc.Capabilities.Add[j] = "NET_BIND_SERVICE"
				}
			}
		}
	}
	for i := range w.InitContainers {
		visit(&w.InitContainers[i])
	}
	for i := range w.Containers {
		visit(&w.Containers[i])
	}
	for i := range w.EphemeralContainers {
		visit((*v1.Container)(&w.EphemeralContainers[i].EphemeralContainerCommon))
	}
	return w, notes
}

func (p Policy) hostPortAllowed(port int32) bool {
	for _, r := range p.AllowedHostPorts {
		if port >= r.First && port <= r.Last {
			return true
		}
	}
	return false
}

func (p Policy) capabilityAllowed(c string) bool {
	want := normalizeCapability(c)
	for _, allowed := range p.AllowedCapabilities {
		if normalizeCapability(allowed) == want {
			return true
		}
	}
	return false
}

func normalizeCapability(c string) string {
	return strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(c)), "CAP_")
}

func quote(s string) string { return strconv.Quote(s) }

func quoteAll(list []string) string {
	if len(list) == 0 {
		return "none"
	}
	q := make([]string, len(list))
	for i, s := range list {
		q[i] = quote(s)
	}
	return strings.Join(q, ", ")
}
