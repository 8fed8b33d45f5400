package lsm

import (
	"os"
	"path/filepath"
	"testing"
)

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestAppArmorEnabled(t *testing.T) {
	for _, tc := range []struct {
		name       string
		securityfs bool
		param      string // "" : no parameter file
		want       bool
	}{
		{"no module", false, "", false},
		{"enabled", true, "Y\n", true},
		{"disabled at boot", true, "N\n", false},
		{"parameter without securityfs", false, "Y\n", false},
		{"securityfs without parameter", true, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if tc.securityfs {
				if err := os.MkdirAll(filepath.Join(root, "kernel", "security", "apparmor"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if tc.param != "" {
				write(t, filepath.Join(root, "module", "apparmor", "parameters", "enabled"), tc.param)
			}
			if got := (Host{Sysfs: root}).AppArmorEnabled(); got != tc.want {
				t.Errorf("AppArmorEnabled() = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSELinuxEnabled(t *testing.T) {
	root := t.TempDir()
	if (Host{Sysfs: root}).SELinuxEnabled() {
		t.Error("SELinux enabled without selinuxfs")
	}
	write(t, filepath.Join(root, "fs", "selinux", "enforce"), "0")
	if !(Host{Sysfs: root}).SELinuxEnabled() {
		t.Error("SELinux not enabled with selinuxfs holding enforce")
	}
}
