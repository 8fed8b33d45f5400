// Package lsm tells which Linux security modules the host enforces, as the
// kubelet asks before it admits a pod that needs one.
package lsm

import (
	"os"
	"path/filepath"
	"strings"
)

// Host reads the security modules' state below a sysfs root ("/sys").
type Host struct{ Sysfs string }

// AppArmorEnabled is the kubelet's test (runc's apparmor.IsEnabled):
// securityfs shows AppArmor and its module parameter "enabled" is Y.
func (h Host) AppArmorEnabled() bool {
	if _, err := os.Stat(filepath.Join(h.Sysfs, "kernel", "security", "apparmor")); err != nil {
		return false
	}
	b, err := os.ReadFile(filepath.Join(h.Sysfs, "module", "apparmor", "parameters", "enabled"))
	return err == nil && strings.HasPrefix(string(b), "Y")
}

// SELinuxEnabled says whether selinuxfs is there with an enforce switch
// (SELinux in enforcing or permissive mode); without it no label applies.
func (h Host) SELinuxEnabled() bool {
	_, err := os.Stat(filepath.Join(h.Sysfs, "fs", "selinux", "enforce"))
	return err == nil
}
