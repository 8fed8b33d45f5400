// Package pki makes the certificates of an mqlet fleet with Go's crypto
// alone: a fleet CA, the broker's server certificate, one client
// certificate per gateway (CN = node name, which mosquitto takes as the
// username for the per-node ACL) and operator certificates.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// OperatorCN is the common name deploy/mosquitto-mqlet.acl grants every
// gateway's command topics to; no gateway may be issued it.
const OperatorCN = "operator"

// CA is a loaded fleet CA that can sign.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// Validity bounds the lifetimes a caller may ask for.
const maxValidity = 20 * 365 * 24 * time.Hour

// Pair is a certificate and its private key, PEM-encoded.
type Pair struct{ CertPEM, KeyPEM []byte }

// NewCA makes a self-signed CA that can sign leaf certificates only.
func NewCA(name string, validity time.Duration, now time.Time) (Pair, error) {
	if name == "" {
		return Pair{}, errors.New("CA name must not be empty")
	}
	tmpl := template(name, validity, now)
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.MaxPathLen = 0
	tmpl.MaxPathLenZero = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature
	return sign(tmpl, nil, validity)
}

// IssueServer signs a server certificate valid for the given DNS names and
// IP addresses (at least one).
func (ca *CA) IssueServer(cn string, hosts []string, validity time.Duration, now time.Time) (Pair, error) {
	if len(hosts) == 0 {
		return Pair{}, errors.New("a server certificate needs at least one host name or IP (--host)")
	}
	tmpl := template(cn, validity, now)
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if err := checkName(h); err != nil {
			return Pair{}, fmt.Errorf("host %q: %w", h, err)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return sign(tmpl, ca, validity)
}

// IssueClient signs a client certificate whose CN is cn: a node name, or
// OperatorCN when operator is true. A node may not be called OperatorCN.
func (ca *CA) IssueClient(cn string, operator bool, validity time.Duration, now time.Time) (Pair, error) {
	if err := checkName(cn); err != nil {
		return Pair{}, fmt.Errorf("name %q: %w", cn, err)
	}
	if !operator && cn == OperatorCN {
		return Pair{}, fmt.Errorf("a gateway may not be named %q: the ACL gives that name every gateway's commands", OperatorCN)
	}
	tmpl := template(cn, validity, now)
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return sign(tmpl, ca, validity)
}

// checkName accepts what is safe as a certificate CN, a file name and an
// MQTT topic level: 1-63 of [a-z0-9.-], not starting with '.' or '-'.
func checkName(s string) error {
	if len(s) == 0 || len(s) > 63 {
		return errors.New("must be 1 to 63 characters")
	}
	if s[0] == '.' || s[0] == '-' {
		return errors.New("must not start with '.' or '-'")
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '.') {
			return fmt.Errorf("%q is not allowed (lowercase letters, digits, '-' and '.')", r)
		}
	}
	return nil
}

func template(cn string, validity time.Duration, now time.Time) *x509.Certificate {
	return &x509.Certificate{
		Subject:   pkix.Name{CommonName: cn, Organization: []string{"mqlet fleet"}},
		NotBefore: now.Add(-5 * time.Minute), // small clock skew between gateways
		NotAfter:  now.Add(validity),
		KeyUsage:  x509.KeyUsageDigitalSignature,
	}
}

func sign(tmpl *x509.Certificate, ca *CA, validity time.Duration) (Pair, error) {
	if validity <= 0 || validity > maxValidity {
		return Pair{}, fmt.Errorf("validity %s must be positive and at most 20 years", validity)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return Pair{}, fmt.Errorf("making a serial number: %w", err)
	}
	tmpl.SerialNumber = serial
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, fmt.Errorf("generating a key: %w", err)
	}
	parent, signer := tmpl, any(key)
	if ca != nil {
		if tmpl.NotAfter.After(ca.Cert.NotAfter) {
			tmpl.NotAfter = ca.Cert.NotAfter
		}
		parent, signer = ca.Cert, ca.Key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		return Pair{}, fmt.Errorf("signing the certificate of %q: %w", tmpl.Subject.CommonName, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Pair{}, fmt.Errorf("encoding the key: %w", err)
	}
	return Pair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// LoadCA reads a CA written by WritePair.
func LoadCA(certFile, keyFile string) (*CA, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("reading the CA certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("reading the CA key: %w", err)
	}
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s holds no PEM certificate", certFile)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parsing %s: %w", certFile, err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("%s is not a CA certificate", certFile)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil || kb.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("%s holds no PEM private key", keyFile)
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parsing %s: %w", keyFile, err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, fmt.Errorf("%s is not the key of %s", keyFile, certFile)
	}
	return &CA{Cert: cert, Key: key}, nil
}

// WritePair writes base.crt (0644) and base.key (0600) into dir, refusing
// to overwrite either: a reissued CA would orphan every certificate in the
// fleet, a reissued key would lock a gateway out.
func WritePair(dir, base string, p Pair) (certFile, keyFile string, err error) {
	if strings.ContainsAny(base, `/\`) || base == "" || base[0] == '.' {
		return "", "", fmt.Errorf("bad file name %q", base)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", fmt.Errorf("creating %s: %w", dir, err)
	}
	certFile, keyFile = filepath.Join(dir, base+".crt"), filepath.Join(dir, base+".key")
	for _, f := range []string{certFile, keyFile} {
		if _, err := os.Lstat(f); err == nil {
			return "", "", fmt.Errorf("%s exists; remove it first to issue a new one", f)
		}
	}
	if err := writeNew(keyFile, p.KeyPEM, 0o600); err != nil {
		return "", "", err
	}
	if err := writeNew(certFile, p.CertPEM, 0o644); err != nil {
		os.Remove(keyFile)
		return "", "", err
	}
	return certFile, keyFile, nil
}

func writeNew(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("creating %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
