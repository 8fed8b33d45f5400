package main

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(data)
	if b == nil {
		t.Fatalf("%s: no PEM", path)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCertsMakeAFleet(t *testing.T) {
	dir := t.TempDir()
	none := map[string]string{}
	if r := runCLIEnv(t, none, "", "certs", "node", "gw-1", "--dir", dir); r.code == 0 || !strings.Contains(r.stderr, "certs ca") {
		t.Fatalf("node cert without a CA: %v", r)
	}
	if r := runCLIEnv(t, none, "", "certs", "ca", "--dir", dir); r.code != 0 || !strings.Contains(r.stdout, "ca.key") {
		t.Fatalf("certs ca: %v", r)
	}
	if r := runCLIEnv(t, none, "", "certs", "ca", "--dir", dir); r.code == 0 || !strings.Contains(r.stderr, "exists") {
		t.Fatalf("second certs ca replaced the fleet CA: %v", r)
	}
	if r := runCLIEnv(t, none, "", "certs", "broker", "--dir", dir); r.code != exitUsage {
		t.Fatalf("broker cert without --host: %v", r)
	}
	if r := runCLIEnv(t, none, "", "certs", "broker", "--dir", dir, "--host", "broker.example,10.0.0.1"); r.code != 0 || !strings.Contains(r.stdout, "/etc/mosquitto/certs/server.crt") {
		t.Fatalf("certs broker: %v", r)
	}
	r := runCLIEnv(t, none, "", "certs", "node", "gw-1", "--dir", dir)
	if r.code != 0 || !strings.Contains(r.stdout, "mqlet init --node gw-1") || !strings.Contains(r.stdout, "/etc/mqlet/tls/node.key") {
		t.Fatalf("certs node: %v", r)
	}
	if r := runCLIEnv(t, none, "", "certs", "node", "operator", "--dir", dir); r.code == 0 {
		t.Fatalf("a gateway was issued the operator's CN: %v", r)
	}
	if r := runCLIEnv(t, none, "", "certs", "operator", "--dir", dir); r.code != 0 || !strings.Contains(r.stdout, "--cert-file") {
		t.Fatalf("certs operator: %v", r)
	}
	ca := readCert(t, filepath.Join(dir, "ca.crt"))
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	opts := x509.VerifyOptions{Roots: roots, CurrentTime: testNow, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	for file, cn := range map[string]string{"gw-1.crt": "gw-1", "operator.crt": "operator"} {
		c := readCert(t, filepath.Join(dir, file))
		if c.Subject.CommonName != cn {
			t.Errorf("%s: CN %q, want %q", file, c.Subject.CommonName, cn)
		}
		if _, err := c.Verify(opts); err != nil {
			t.Errorf("%s does not verify against the fleet CA: %v", file, err)
		}
	}
	srv := readCert(t, filepath.Join(dir, "broker.crt"))
	if err := srv.VerifyHostname("10.0.0.1"); err != nil {
		t.Errorf("broker cert: %v", err)
	}
	if err := srv.VerifyHostname("broker.example"); err != nil {
		t.Errorf("broker cert: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "gw-1.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("node key: %v %v", fi.Mode(), err)
	}
}
