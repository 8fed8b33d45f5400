package pki

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func parse(t *testing.T, p []byte) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode(p)
	if b == nil {
		t.Fatal("no PEM")
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestChainVerifiesForEachRole(t *testing.T) {
	now := time.Now()
	dir := t.TempDir()
	caPair, err := NewCA("fleet", 24*time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	cf, kf, err := WritePair(dir, "ca", caPair)
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(kf); fi.Mode().Perm() != 0o600 {
		t.Fatalf("CA key mode %v", fi.Mode().Perm())
	}
	ca, err := LoadCA(cf, kf)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)

	srv, err := ca.IssueServer("broker", []string{"broker.example", "127.0.0.1"}, 48*time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	sc := parse(t, srv.CertPEM)
	if _, err := sc.Verify(x509.VerifyOptions{Roots: roots, DNSName: "127.0.0.1", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Fatalf("server cert for 127.0.0.1: %v", err)
	}
	if !sc.NotAfter.Equal(ca.Cert.NotAfter) {
		t.Fatalf("server cert outlives its CA: %v > %v", sc.NotAfter, ca.Cert.NotAfter)
	}
	node, err := ca.IssueClient("gw-1", false, time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	nc := parse(t, node.CertPEM)
	if nc.Subject.CommonName != "gw-1" {
		t.Fatalf("CN %q", nc.Subject.CommonName)
	}
	if _, err := nc.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("node cert: %v", err)
	}
	if _, err := nc.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Fatal("a node certificate verifies as a server")
	}
	if _, _, err := WritePair(dir, "ca", caPair); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("overwrote the CA: %v", err)
	}
}

func TestNamesThatMustBeRefused(t *testing.T) {
	now := time.Now()
	p, err := NewCA("fleet", time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cf, kf, _ := WritePair(dir, "ca", p)
	ca, err := LoadCA(cf, kf)
	if err != nil {
		t.Fatal(err)
	}
	for _, cn := range []string{"operator", "", "../x", "a/b", "GW", "a+b", "#", ".hidden", strings.Repeat("a", 64)} {
		if _, err := ca.IssueClient(cn, false, time.Hour, now); err == nil {
			t.Errorf("node %q was issued", cn)
		}
	}
	if _, err := ca.IssueClient("operator", true, time.Hour, now); err != nil {
		t.Errorf("operator: %v", err)
	}
	if _, err := ca.IssueServer("b", nil, time.Hour, now); err == nil {
		t.Error("server cert without hosts")
	}
	if _, err := ca.IssueClient("gw", false, 30*365*24*time.Hour, now); err == nil {
		t.Error("30-year certificate issued")
	}
	other, _ := NewCA("other", time.Hour, now)
	odir := t.TempDir()
	ocf, _, _ := WritePair(odir, "ca", other)
	if _, err := LoadCA(ocf, kf); err == nil {
		t.Error("loaded a CA with another CA's key")
	}
	if _, err := LoadCA(filepath.Join(dir, "missing.crt"), kf); err == nil {
		t.Error("loaded a missing CA")
	}
}
