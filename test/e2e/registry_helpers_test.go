package e2e

import (
	"archive/tar"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mqlet/mqlet/internal/testutil/containerd"
)

// allowLocalRegistries is the images.allowedRegistries line (under
// images:) that admits the test registries on 127.0.0.1, any port, beside
// every registry that is not the node itself: the default refuses loopback.
const allowLocalRegistries = "  allowedRegistries: [\"*\", \"127.0.0.1\"]\n"

// Registry is one docker-registry (CNCF distribution) process on a free
// loopback port, optionally with TLS (a CA made here) and htpasswd auth. The
// test containerd trusts it through a hosts.toml in its certs.d directory
// (test/env/containerd-up.sh sets config_path), which containerd reads at
// every pull. Stop and Start keep its storage, so a stopped registry comes
// back with the same images.
type Registry struct {
	t          testing.TB
	Host       string // 127.0.0.1:port
	User, Pass string // empty: no auth
	dir        string
	caFile     string
	hostsDir   string // containerd's certs.d
	cmd        *exec.Cmd
	done       chan struct{}
	logs       *syncBuffer
	client     *http.Client
	scheme     string
}

// StartRegistry starts a registry; secure adds TLS and htpasswd auth with
// a random password. It is stopped and its hosts.toml removed when the test ends.
func StartRegistry(t testing.TB, secure bool) *Registry {
	t.Helper()
	if _, err := exec.LookPath("docker-registry"); err != nil {
		t.Fatalf("docker-registry is not installed (apt-get install docker-registry; test/env/install-deps.sh does it)")
	}
	endpoint := containerd.Endpoint(t)
	r := &Registry{t: t, dir: t.TempDir(), Host: freeLoopbackAddr(t), logs: &syncBuffer{},
		hostsDir: filepath.Join(filepath.Dir(strings.TrimPrefix(endpoint, "unix://")), "certs.d"), scheme: "http"}
	cfg := fmt.Sprintf("version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: %s\n  delete:\n    enabled: true\nhttp:\n  addr: %s\n",
		filepath.Join(r.dir, "data"), r.Host)
	r.client = &http.Client{Timeout: 5 * time.Minute}
	if secure {
		r.scheme = "https"
		certFile, keyFile, pool := makeTestCA(t, r.dir)
		r.caFile = filepath.Join(r.dir, "ca.pem")
		cfg += fmt.Sprintf("  tls:\n    certificate: %s\n    key: %s\n", certFile, keyFile)
		r.client.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
		r.User, r.Pass = "gateway", "pw-"+randomHex(8)
		out, err := exec.Command("htpasswd", "-Bbn", r.User, r.Pass).Output()
		if err != nil {
			t.Fatalf("htpasswd (apache2-utils): %v", err)
		}
		htpasswd := filepath.Join(r.dir, "htpasswd")
		if err := os.WriteFile(htpasswd, bytes.TrimSpace(out), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg += fmt.Sprintf("auth:\n  htpasswd:\n    realm: mqlet-test\n    path: %s\n", htpasswd)
	}
	if err := os.WriteFile(filepath.Join(r.dir, "config.yml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	// containerd 1.6 wants a [host] section, and after a failure there it
	// tries the server again with the top-level settings: both carry the CA.
	hosts := fmt.Sprintf("server = %q\ncapabilities = [\"pull\", \"resolve\", \"push\"]\n", r.URL())
	if r.caFile != "" {
		hosts += fmt.Sprintf("ca = %q\n", r.caFile)
	}
	hosts += fmt.Sprintf("\n[host.%q]\n  capabilities = [\"pull\", \"resolve\", \"push\"]\n", r.URL())
	if r.caFile != "" {
		hosts += fmt.Sprintf("  ca = %q\n", r.caFile)
	}
	if err := os.MkdirAll(filepath.Join(r.hostsDir, r.Host), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.hostsDir, r.Host, "hosts.toml"), []byte(hosts), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.Stop()
		_ = os.RemoveAll(filepath.Join(r.hostsDir, r.Host))
		if t.Failed() {
			t.Logf("registry %s log (tail):\n%s", r.Host, tail(r.logs.String(), 30))
		}
	})
	r.Start()
	return r
}

// UseMirrors rewrites this registry's hosts.toml so containerd tries the
// mirrors in order before it (containerd's hosts.d, which mqlet leaves
// registry mirrors to, as the kubelet does).
func (r *Registry) UseMirrors(mirrors ...*Registry) {
	r.t.Helper()
	hosts := fmt.Sprintf("server = %q\ncapabilities = [\"pull\", \"resolve\", \"push\"]\n", r.URL())
	if r.caFile != "" {
		hosts += fmt.Sprintf("ca = %q\n", r.caFile)
	}
	for _, m := range mirrors {
		hosts += fmt.Sprintf("\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", m.URL())
		if m.caFile != "" {
			hosts += fmt.Sprintf("  ca = %q\n", m.caFile)
		}
	}
	if err := os.WriteFile(filepath.Join(r.hostsDir, r.Host, "hosts.toml"), []byte(hosts), 0o644); err != nil {
		r.t.Fatal(err)
	}
}

// URL is the registry's base URL.
func (r *Registry) URL() string { return r.scheme + "://" + r.Host }

// Start (re)starts the registry process and waits until /v2/ answers.
func (r *Registry) Start() {
	r.t.Helper()
	r.cmd = exec.Command("docker-registry", "serve", filepath.Join(r.dir, "config.yml"))
	r.cmd.Stdout, r.cmd.Stderr = r.logs, r.logs
	if err := r.cmd.Start(); err != nil {
		r.t.Fatalf("starting docker-registry: %v", err)
	}
	r.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(r.cmd, r.done)
	Eventually(r.t, 20*time.Second, "registry "+r.Host+" answers /v2/", func() bool {
		resp, err := r.client.Get(r.URL() + "/v2/")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusUnauthorized
	})
}

// Stop stops the registry process (its storage stays).
func (r *Registry) Stop() {
	if r.cmd == nil || r.cmd.Process == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	<-r.done
	r.cmd = nil
}

// Push tags the local image src (in the test containerd) as name:tag in this
// registry and pushes it with ctr. It returns the full reference.
func (r *Registry) Push(src, name string) string {
	r.t.Helper()
	ref := r.Host + "/" + name
	sock := strings.TrimPrefix(containerd.Endpoint(r.t), "unix://")
	ctr := func(args ...string) {
		r.t.Helper()
		out, err := exec.Command("ctr", append([]string{"-n", "k8s.io", "-a", sock}, args...)...).CombinedOutput()
		if err != nil {
			r.t.Fatalf("ctr %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	ctr("images", "tag", "--force", src, ref)
	args := []string{"images", "push", "--hosts-dir", r.hostsDir}
	if r.User != "" {
		args = append(args, "-u", r.User+":"+r.Pass)
	}
	ctr(append(args, ref)...)
	// The tag is only needed for pushing; pulls must fetch it from here.
	ctr("images", "rm", ref)
	return ref
}

// untag removes one image name from the test containerd (its content stays
// while other names use it).
func untag(t testing.TB, ref string) {
	t.Helper()
	sock := strings.TrimPrefix(containerd.Endpoint(t), "unix://")
	if out, err := exec.Command("ctr", "-n", "k8s.io", "-a", sock, "images", "rm", ref).CombinedOutput(); err != nil {
		t.Logf("ctr images rm %s: %v: %s", ref, err, out)
	}
}

// do sends one registry API request with the registry's credentials.
func (r *Registry) do(method, path, contentType string, body io.Reader, size int64) *http.Response {
	r.t.Helper()
	req, err := http.NewRequest(method, r.URL()+path, body)
	if err != nil {
		r.t.Fatal(err)
	}
	if size >= 0 {
		req.ContentLength = size
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json")
	if r.User != "" {
		req.SetBasicAuth(r.User, r.Pass)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		r.t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp
}

func (r *Registry) get(path string) []byte {
	r.t.Helper()
	resp := r.do(http.MethodGet, path, "", nil, -1)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		r.t.Fatalf("GET %s: %s: %s", path, resp.Status, b)
	}
	return b
}

// uploadBlob uploads the blob read from body (size bytes, digest dgst).
func (r *Registry) uploadBlob(repo, dgst string, body io.Reader, size int64) {
	r.t.Helper()
	resp := r.do(http.MethodPost, "/v2/"+repo+"/blobs/uploads/", "", nil, 0)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		r.t.Fatalf("starting blob upload to %s: %s", repo, resp.Status)
	}
	loc := resp.Header.Get("Location")
	if strings.HasPrefix(loc, r.URL()) {
		loc = strings.TrimPrefix(loc, r.URL())
	}
	sep := "?"
	if strings.Contains(loc, "?") {
		sep = "&"
	}
	resp = r.do(http.MethodPut, loc+sep+"digest="+dgst, "application/octet-stream", body, size)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		r.t.Fatalf("uploading blob %s: %s: %s", dgst, resp.Status, b)
	}
}

type ociDescriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
}

type ociManifest struct {
	SchemaVersion int             `json:"schemaVersion"`
	MediaType     string          `json:"mediaType,omitempty"`
	Config        ociDescriptor   `json:"config"`
	Layers        []ociDescriptor `json:"layers"`
}

// Derive publishes to:tag as a copy of the image from (a reference in this
// registry, "repo:tag") with the environment variable MARK=mark added to its
// config and, when extraBytes > 0, a layer of that many random bytes
// (/data/random). Each call makes an image with a new digest; it returns
// the new manifest digest.
func (r *Registry) Derive(from, to, mark string, extraBytes int64) string {
	r.t.Helper()
	fromRepo, fromTag, _ := strings.Cut(from, ":")
	toRepo, toTag, _ := strings.Cut(to, ":")
	var m ociManifest
	if err := json.Unmarshal(r.get("/v2/"+fromRepo+"/manifests/"+fromTag), &m); err != nil {
		r.t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(r.get("/v2/"+fromRepo+"/blobs/"+m.Config.Digest), &cfg); err != nil {
		r.t.Fatal(err)
	}
	// Layers of another repository are mounted, not copied.
	for _, l := range m.Layers {
		resp := r.do(http.MethodPost, "/v2/"+toRepo+"/blobs/uploads/?mount="+l.Digest+"&from="+fromRepo, "", nil, 0)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			r.t.Fatalf("mounting layer %s into %s: %s", l.Digest, toRepo, resp.Status)
		}
	}
	if extraBytes > 0 {
		file, dgst, size := randomLayer(r.t, extraBytes)
		f, err := os.Open(file)
		if err != nil {
			r.t.Fatal(err)
		}
		r.uploadBlob(toRepo, dgst, f, size)
		f.Close()
		_ = os.Remove(file)
		m.Layers = append(m.Layers, ociDescriptor{MediaType: "application/vnd.oci.image.layer.v1.tar", Digest: dgst, Size: size})
		rootfs := cfg["rootfs"].(map[string]any)
		rootfs["diff_ids"] = append(rootfs["diff_ids"].([]any), dgst) // uncompressed: diff id = digest
	}
	inner, _ := cfg["config"].(map[string]any)
	if inner == nil {
		inner = map[string]any{}
		cfg["config"] = inner
	}
	env, _ := inner["Env"].([]any)
	inner["Env"] = append(env, "MARK="+mark)
	cfgBytes, _ := json.Marshal(cfg)
	cfgDigest := digestOf(cfgBytes)
	r.uploadBlob(toRepo, cfgDigest, bytes.NewReader(cfgBytes), int64(len(cfgBytes)))
	m.Config = ociDescriptor{MediaType: m.Config.MediaType, Digest: cfgDigest, Size: int64(len(cfgBytes))}
	if m.MediaType == "" {
		m.MediaType = "application/vnd.oci.image.manifest.v1+json"
	}
	mBytes, _ := json.Marshal(m)
	resp := r.do(http.MethodPut, "/v2/"+toRepo+"/manifests/"+toTag, m.MediaType, bytes.NewReader(mBytes), int64(len(mBytes)))
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		r.t.Fatalf("putting manifest %s: %s: %s", to, resp.Status, b)
	}
	return digestOf(mBytes)
}

// randomLayer writes an uncompressed layer tar holding /data/random of n
// random bytes to a temp file and returns its path, digest and size.
func randomLayer(t testing.TB, n int64) (string, string, int64) {
	t.Helper()
	f, err := os.CreateTemp("", "mqlet-layer-*.tar")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	w := io.MultiWriter(f, h)
	tw := tar.NewWriter(w)
	now := time.Now()
	_ = tw.WriteHeader(&tar.Header{Name: "data/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: now})
	if err := tw.WriteHeader(&tar.Header{Name: "data/random", Typeflag: tar.TypeReg, Mode: 0o644, Size: n, ModTime: now}); err != nil {
		t.Fatal(err)
	}
	var seed [32]byte
	_, _ = rand.Read(seed[:])
	if _, err := io.CopyN(tw, mrand.NewChaCha8(seed), n); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	st, _ := f.Stat()
	return f.Name(), "sha256:" + hex.EncodeToString(h.Sum(nil)), st.Size()
}

func digestOf(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func freeLoopbackAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// makeTestCA writes a CA (dir/ca.pem) and a server certificate for 127.0.0.1
// signed by it, and returns the certificate and key files and the CA pool.
func makeTestCA(t testing.TB, dir string) (string, string, *x509.CertPool) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "mqlet test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	write := func(name, typ string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("ca.pem", "CERTIFICATE", caDER)
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	return write("server.pem", "CERTIFICATE", der), write("server-key.pem", "EC PRIVATE KEY", keyDER), pool
}
