package validate

import (
	"path"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Policy is the node's admission policy. Its zero value denies everything
// it covers: privileged containers, host namespaces, hostPath volumes and
// added capabilities.
type Policy struct {
	AllowPrivileged  bool `json:"allowPrivileged" yaml:"allowPrivileged"`
	AllowHostNetwork bool `json:"allowHostNetwork" yaml:"allowHostNetwork"`
	AllowHostPID     bool `json:"allowHostPID" yaml:"allowHostPID"`
	AllowHostIPC     bool `json:"allowHostIPC" yaml:"allowHostIPC"`
	// AllowedHostPaths are absolute directory prefixes; a hostPath volume is
	// allowed only if its cleaned path is one of them or lies beneath one.
	AllowedHostPaths []string `json:"allowedHostPaths,omitempty" yaml:"allowedHostPaths,omitempty"`
	// AllowedCapabilities may be added to containers ("NET_ADMIN" or
	// "CAP_NET_ADMIN"; "ALL" only if listed itself).
	AllowedCapabilities []string `json:"allowedCapabilities,omitempty" yaml:"allowedCapabilities,omitempty"`
}

const deniedByPolicy = "denied by the node's admission policy"

// Check returns one Forbidden error per violation, with its field path.
func (p Policy) Check(spec *v1.PodSpec) field.ErrorList {
	var errs field.ErrorList
	specPath := field.NewPath("spec")
	if spec.HostNetwork && !p.AllowHostNetwork {
		errs = append(errs, field.Forbidden(specPath.Child("hostNetwork"), deniedByPolicy+" (allowHostNetwork)"))
	}
	if spec.HostPID && !p.AllowHostPID {
		errs = append(errs, field.Forbidden(specPath.Child("hostPID"), deniedByPolicy+" (allowHostPID)"))
	}
	if spec.HostIPC && !p.AllowHostIPC {
		errs = append(errs, field.Forbidden(specPath.Child("hostIPC"), deniedByPolicy+" (allowHostIPC)"))
	}
	for i, vol := range spec.Volumes {
		if vol.HostPath == nil {
			continue
		}
		if !p.hostPathAllowed(vol.HostPath.Path) {
			errs = append(errs, field.Forbidden(specPath.Child("volumes").Index(i).Child("hostPath", "path"),
				"hostPath "+quote(vol.HostPath.Path)+" is "+deniedByPolicy+" (allowedHostPaths: "+quoteAll(p.AllowedHostPaths)+")"))
		}
	}
	for i := range spec.InitContainers {
		errs = append(errs, p.checkSecurityContext(spec.InitContainers[i].SecurityContext, specPath.Child("initContainers").Index(i))...)
	}
	for i := range spec.Containers {
		errs = append(errs, p.checkSecurityContext(spec.Containers[i].SecurityContext, specPath.Child("containers").Index(i))...)
	}
	for i := range spec.EphemeralContainers {
		errs = append(errs, p.checkSecurityContext(spec.EphemeralContainers[i].SecurityContext, specPath.Child("ephemeralContainers").Index(i))...)
	}
	return errs
}

func (p Policy) checkSecurityContext(sc *v1.SecurityContext, containerPath *field.Path) field.ErrorList {
	if sc == nil {
		return nil
	}
	var errs field.ErrorList
	scPath := containerPath.Child("securityContext")
	if sc.Privileged != nil && *sc.Privileged && !p.AllowPrivileged {
		errs = append(errs, field.Forbidden(scPath.Child("privileged"), deniedByPolicy+" (allowPrivileged)"))
	}
	if sc.Capabilities != nil {
		for j, c := range sc.Capabilities.Add {
			if !p.capabilityAllowed(string(c)) {
				errs = append(errs, field.Forbidden(scPath.Child("capabilities", "add").Index(j),
					"capability "+quote(string(c))+" is "+deniedByPolicy+" (allowedCapabilities: "+quoteAll(p.AllowedCapabilities)+")"))
			}
		}
	}
	return errs
}

// hostPathAllowed compares cleaned absolute paths component-wise, so that
// "/data/../etc" is judged as "/etc" and "/database" is not under "/data".
func (p Policy) hostPathAllowed(hostPath string) bool {
	if !strings.HasPrefix(hostPath, "/") {
		return false
	}
	cleaned := path.Clean(hostPath)
	for _, allowed := range p.AllowedHostPaths {
		if !strings.HasPrefix(allowed, "/") {
			continue // a relative prefix in the config allows nothing
		}
		prefix := path.Clean(allowed)
		if prefix == "/" || cleaned == prefix || strings.HasPrefix(cleaned, prefix+"/") {
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

func quote(s string) string { return `"` + s + `"` }

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
