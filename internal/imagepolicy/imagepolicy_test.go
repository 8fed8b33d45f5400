package imagepolicy

import (
	"context"
	"errors"
	"net"
	"testing"
)

func TestDefaultRefusesTheNodeItself(t *testing.T) {
	p, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	p.ownAddrs = func() []net.IP { return []net.IP{net.ParseIP("10.1.2.3")} }
	for image, allowed := range map[string]bool{
		"busybox:1":                     true,
		"docker.io/library/busybox:1":   true,
		"registry.example.com/app:1":    true,
		"10.9.9.9:5000/app:1":           true,
		"127.0.0.1:5000/app:1":          false,
		"127.0.0.1/app:1":               false,
		"127.1:22/app:1":                false,
		"2130706433:22/app:1":           false,
		"0x7f000001:22/app:1":           false,
		"localhost:5000/app:1":          false,
		"LOCALHOST:5000/app:1":          false,
		"x.localhost:5000/app:1":        false,
		"[::1]:5000/app:1":              false,
		"[::]:5000/app:1":               false,
		"0.0.0.0:5000/app:1":            false,
		"169.254.169.254/latest:1":      false,
		"[fe80::1]:80/app:1":            false,
		"10.1.2.3:5000/app:1":           false,
		"[::ffff:127.0.0.1]:5000/app:1": false,
		"registry.example.com:443/app@sha256:0000000000000000000000000000000000000000000000000000000000000000": true,
	} {
		err := p.Check(image)
		if (err == nil) != allowed {
			t.Errorf("Check(%q) = %v, want allowed %v", image, err, allowed)
		}
		if err != nil && !errors.Is(err, ErrNotAllowed) && allowed {
			t.Errorf("Check(%q): %v", image, err)
		}
	}
}

func TestListedRegistries(t *testing.T) {
	p, err := New([]string{"127.0.0.1:5000", "*.corp.example", "mirror.local"})
	if err != nil {
		t.Fatal(err)
	}
	for image, allowed := range map[string]bool{
		"127.0.0.1:5000/app:1":       true,
		"127.0.0.1:5001/app:1":       false,
		"reg.corp.example/app:1":     true,
		"corp.example/app:1":         false,
		"mirror.local:8443/app:1":    true,
		"busybox:1":                  false, // no "*": only what is listed
		"registry.example.com/app:1": false,
	} {
		if err := p.Check(image); (err == nil) != allowed {
			t.Errorf("Check(%q) = %v, want allowed %v", image, err, allowed)
		}
	}
	both, _ := New([]string{"*", "127.0.0.1:5000"})
	if both.Check("busybox:1") != nil || both.Check("127.0.0.1:5000/a:1") != nil || both.Check("127.0.0.1:22/a:1") == nil {
		t.Error("* plus a listed local registry")
	}
	for _, bad := range []string{"http://x", "a b", "x:99999", "x:"} {
		if _, err := New([]string{bad}); err == nil {
			t.Errorf("pattern %q accepted", bad)
		}
	}
}

func TestCheckResolvedRefusesNamesOfLocalAddresses(t *testing.T) {
	p, _ := New(nil)
	p.ownAddrs = func() []net.IP { return nil }
	p.lookup = func(_ context.Context, host string) ([]net.IP, error) {
		switch host {
		case "sneaky.example":
			return []net.IP{net.ParseIP("203.0.113.7"), net.ParseIP("127.0.0.1")}, nil
		case "registry-1.docker.io", "fine.example":
			return []net.IP{net.ParseIP("203.0.113.8")}, nil
		}
		return nil, errors.New("no such host")
	}
	ctx := context.Background()
	if err := p.CheckResolved(ctx, "sneaky.example/app:1"); !errors.Is(err, ErrNotAllowed) {
		t.Errorf("a name resolving to loopback: %v", err)
	}
	for _, ok := range []string{"fine.example/app:1", "busybox:1", "unknown.example/app:1"} {
		if err := p.CheckResolved(ctx, ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
}
