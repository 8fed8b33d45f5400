// Package imagepolicy decides which registries a pod's images may come
// from. An image reference names the host the runtime connects to, so an
// unchecked one lets a broker login make the node connect to its own
// services (127.0.0.1:22, a link-local metadata service, the node's own
// addresses) and read their answers back in events and statuses.
package imagepolicy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"

	"github.com/distribution/reference"
)

// Any is the pattern for every registry that is not the node itself:
// neither loopback, link-local, unspecified nor one of the node's own
// addresses (nor a name such as localhost that means one).
const Any = "*"

// Default is the list used when none is configured.
var Default = []string{Any}

// ErrNotAllowed is wrapped by every refusal.
var ErrNotAllowed = errors.New("not allowed by images.allowedRegistries")

// Policy holds the allowed registries. The zero value allows what Default
// does. Safe for concurrent use.
type Policy struct {
	any      bool
	patterns []pattern
	// ownAddrs lists the node's addresses (nil: the interfaces').
	ownAddrs func() []net.IP
	// lookup resolves a name (nil: net.DefaultResolver).
	lookup func(ctx context.Context, host string) ([]net.IP, error)
}

type pattern struct {
	host string // lower case; "*.example.com" matches below example.com
	port string // "" matches any port
}

// New parses patterns: "*" (any registry that is not local), a host
// ("registry.example.com", "10.0.0.5"), a host and port
// ("127.0.0.1:5000", "[::1]:5000") or a wildcard domain ("*.example.com").
// A listed host is allowed even when local: listing is the operator's
// explicit choice. nil or empty: Default.
func New(list []string) (*Policy, error) {
	if len(list) == 0 {
		list = Default
	}
	p := &Policy{}
	for _, s := range list {
		if s == Any {
			p.any = true
			continue
		}
		pt, err := parsePattern(s)
		if err != nil {
			return nil, err
		}
		p.patterns = append(p.patterns, pt)
	}
	return p, nil
}

var hostChars = regexp.MustCompile(`^(\*\.)?[a-z0-9]([a-z0-9.-]*[a-z0-9])?$`)

func parsePattern(s string) (pattern, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	host, port := splitHostPort(s)
	if strings.HasSuffix(s, ":") {
		return pattern{}, fmt.Errorf("registry %q: empty port", s)
	}
	if port != "" {
		if n, err := parsePort(port); err != nil || n == 0 {
			return pattern{}, fmt.Errorf("registry %q: bad port", s)
		}
	}
	if net.ParseIP(host) == nil && !hostChars.MatchString(host) {
		return pattern{}, fmt.Errorf("registry %q: want *, a host, host:port or *.domain", s)
	}
	return pattern{host: host, port: port}, nil
}

func parsePort(s string) (int, error) {
	n := 0
	if s == "" || len(s) > 5 {
		return 0, errors.New("bad port")
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, errors.New("bad port")
		}
		n = n*10 + int(c-'0')
	}
	if n > 65535 {
		return 0, errors.New("bad port")
	}
	return n, nil
}

// splitHostPort splits "host[:port]" and "[v6][:port]"; a bare IPv6
// address is all host.
func splitHostPort(s string) (host, port string) {
	if strings.HasPrefix(s, "[") {
		if i := strings.Index(s, "]"); i > 0 {
			host, rest := s[1:i], s[i+1:]
			return host, strings.TrimPrefix(rest, ":")
		}
		return s, ""
	}
	if strings.Count(s, ":") == 1 {
		h, p, _ := strings.Cut(s, ":")
		return h, p
	}
	return s, ""
}

// Registry is the registry host (with its port, as written) an image
// reference pulls from: docker.io for a bare name, as the runtime reads it.
func Registry(image string) (string, error) {
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return "", fmt.Errorf("image %q: %w", image, err)
	}
	return reference.Domain(named), nil
}

// Check refuses an image whose registry is not allowed, without any
// lookup or connection: a host named by a listed pattern passes, and
// under "*" any host but a local address, a name meaning one (localhost,
// *.localhost) or a numeric host that is not a canonical IP address
// ("127.1", "2130706433", "0x7f.1", which resolvers read as 127.0.0.1).
// A DNS name is looked at again when it is pulled (CheckResolved).
func (p *Policy) Check(image string) error {
	reg, err := Registry(image)
	if err != nil {
		return err
	}
	host, port := splitHostPort(strings.ToLower(reg))
	host = strings.TrimSuffix(host, ".")
	if p.listed(host, port) {
		return nil
	}
	if !p.anyOrDefault() {
		return fmt.Errorf("registry %s is %w", reg, ErrNotAllowed)
	}
	if why := p.local(host); why != "" {
		return fmt.Errorf("registry %s (%s) is %w", reg, why, ErrNotAllowed)
	}
	return nil
}

// CheckResolved is Check, and for a registry allowed only by "*" under a
// DNS name, also refuses the name when it resolves to a local address
// (checked just before the pull; a name that re-resolves between this
// check and the runtime's own lookup is not caught).
func (p *Policy) CheckResolved(ctx context.Context, image string) error {
	if err := p.Check(image); err != nil {
		return err
	}
	reg, _ := Registry(image)
	host, port := splitHostPort(strings.ToLower(reg))
	host = strings.TrimSuffix(host, ".")
	if p.listed(host, port) || net.ParseIP(host) != nil {
		return nil
	}
	if reg == "docker.io" {
		host = "registry-1.docker.io" // where the runtime goes for it
	}
	ips, err := p.resolve(ctx, host)
	if err != nil {
		return nil // the pull reports it ("no such host")
	}
	for _, ip := range ips {
		if why := p.localIP(ip); why != "" {
			return fmt.Errorf("registry %s resolves to %s (%s) and is %w", reg, ip, why, ErrNotAllowed)
		}
	}
	return nil
}

func (p *Policy) anyOrDefault() bool {
	return p == nil || p.any || len(p.patterns) == 0
}

func (p *Policy) listed(host, port string) bool {
	if p == nil {
		return false
	}
	for _, pt := range p.patterns {
		if pt.port != "" && pt.port != port {
			continue
		}
		if pt.host == host {
			return true
		}
		if suffix, ok := strings.CutPrefix(pt.host, "*."); ok && strings.HasSuffix(host, "."+suffix) {
			return true
		}
	}
	return false
}

var numericLabel = regexp.MustCompile(`^(0x[0-9a-f]*|[0-9]+)$`)

// local says why host is the node itself ("" when it is not, as far as
// can be told without a lookup).
func (p *Policy) local(host string) string {
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return "localhost"
	}
	if ip := net.ParseIP(host); ip != nil {
		return p.localIP(ip)
	}
	numeric := true
	for _, l := range strings.Split(host, ".") {
		if !numericLabel.MatchString(l) {
			numeric = false
			break
		}
	}
	if numeric {
		return "a numeric host that is not a canonical IP address"
	}
	return ""
}

func (p *Policy) localIP(ip net.IP) string {
	switch {
	case ip.IsLoopback():
		return "loopback address"
	case ip.IsUnspecified():
		return "unspecified address"
	case ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast(), ip.IsInterfaceLocalMulticast():
		return "link-local address"
	}
	for _, own := range p.own() {
		if own.Equal(ip) {
			return "an address of this node"
		}
	}
	return ""
}

func (p *Policy) own() []net.IP {
	if p != nil && p.ownAddrs != nil {
		return p.ownAddrs()
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	out := make([]net.IP, 0, len(addrs))
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			out = append(out, n.IP)
		}
	}
	return out
}

func (p *Policy) resolve(ctx context.Context, host string) ([]net.IP, error) {
	if p != nil && p.lookup != nil {
		return p.lookup(ctx, host)
	}
	addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return nil, err
	}
	out := make([]net.IP, len(addrs))
	for i, a := range addrs {
		out[i] = a.IP
	}
	return out, nil
}
