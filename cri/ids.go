package cri

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Every host path the runtime builds from pod data (pod and volume
// directories, log directories, cgroups, subpath mounts) goes through the
// checks here first: a uid like "../../x" or a name with a slash would
// otherwise make or remove directories anywhere on the node.

// uuidPattern is the canonical 8-4-4-4-12 form only (no braces, no urn:).
var uuidPattern = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// IsUID reports whether uid is a UUID, the only form the runtime puts into
// a path.
func IsUID(uid string) bool { return uuidPattern.MatchString(uid) }

func checkUID(uid string) error {
	if !IsUID(uid) {
		return fmt.Errorf("pod uid %q is not a UUID; refusing to build host paths from it", uid)
	}
	return nil
}

// checkPodIdentity checks what the pod's host paths are built from.
func checkPodIdentity(uid, name, namespace string) error {
	if err := checkUID(uid); err != nil {
		return err
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("pod name %q is not a DNS subdomain: %s", name, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return fmt.Errorf("pod namespace %q is not a DNS label: %s", namespace, strings.Join(errs, "; "))
	}
	return nil
}

// checkLabelName checks a container or volume name, which becomes one path
// component.
func checkLabelName(kind, name string) error {
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return fmt.Errorf("%s name %q is not a DNS label: %s", kind, name, strings.Join(errs, "; "))
	}
	return nil
}

// childOf joins one checked component under base and makes sure the
// result is a direct child (defence against a check missed upstream).
func childOf(base, name string) (string, error) {
	p := filepath.Join(base, name)
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') || filepath.Dir(p) != filepath.Clean(base) {
		return "", fmt.Errorf("%q is not a plain name under %s", name, base)
	}
	return p, nil
}
