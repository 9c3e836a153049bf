// Package egress is a small forward proxy (HTTP CONNECT and plain HTTP) that lets job pods reach
// only the destinations of a domain allowlist, records every decision, and serves the blocked
// ones per client so that the job log can name them. Job pods are forced through it by their
// NetworkPolicy (they may reach the proxy and nothing else); see docs/egress.md.
package allowlist

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// DefaultPorts are the ports of a rule that names none: the web.
var DefaultPorts = []int{80, 443}

// Rule is one allowlist entry. Its text is what users wrote, normalized; it names the rule in
// decisions.
//
//	gitlab.example.com        that host, ports 80 and 443
//	gitlab.example.com:22     that host, port 22 only
//	*.example.com:443         any name below example.com (not example.com itself), port 443
//	registry.example.com:*    that host, any port
//	10.0.0.5:80, [2001:db8::1]:443
//	                          an IP literal; only a client that asks for that literal address
//	                          matches it, never a name that resolves to it
//	10.1.2.0/24:443, [fd00::/8]:443
//	                          a network: any address in it that a client asks for
//
// A name resolved by DNS may lead to a private, loopback or other non-public address only if
// an IP or network rule names that address explicitly (Addresses), or if the rule is the
// job's GitLab instance (Private).
type Rule struct {
	Text string
	// Private lets the rule's names resolve to private addresses (RFC 1918, ULA, ...): the job's
	// GitLab instance, which may be on-premises (Grant.Instance).
	Private bool
	// host is the lowercased name, or the suffix ".example.com" of a wildcard.
	host     string
	wildcard bool
	prefix   netip.Prefix // valid for IP-literal (a single address) and network rules
	ports    []int        // nil: any port
}

// ParseRule parses one allowlist entry.
func ParseRule(s string) (Rule, error) {
	text := strings.TrimSpace(s)
	host, portText := text, ""
	if !isIPOrNetwork(text) { // a bare IPv6 literal or network has colons but no port
		if h, p, err := net.SplitHostPort(text); err == nil {
			if p == "" {
				return Rule{}, fmt.Errorf("allowlist entry %q has an empty port (write none for 80 and 443, or * for any)", s)
			}
			host, portText = h, p
		} else if strings.Contains(text, "]") || strings.Count(text, ":") > 0 {
			return Rule{}, fmt.Errorf("allowlist entry %q: %v", s, err)
		}
	}
	r := Rule{}
	switch {
	case portText == "":
		r.ports = DefaultPorts
	case portText == "*":
		r.ports = nil
	default:
		p, err := ParsePort(portText)
		if err != nil {
			return Rule{}, fmt.Errorf("allowlist entry %q: %v", s, err)
		}
		r.ports = []int{p}
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		if addr.Zone() != "" {
			return Rule{}, fmt.Errorf("allowlist entry %q: IPv6 zones are not allowed", s)
		}
		addr = addr.Unmap()
		r.prefix = netip.PrefixFrom(addr, addr.BitLen())
		r.Text = joinHostPort(addr.String(), portText)
		return r, nil
	}
	if prefix, err := netip.ParsePrefix(host); err == nil {
		if prefix.Addr().Is4In6() {
			return Rule{}, fmt.Errorf("allowlist entry %q: write an IPv4 network in IPv4", s)
		}
		r.prefix = prefix.Masked()
		r.Text = joinHostPort(r.prefix.String(), portText)
		return r, nil
	}
	name := host
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		r.wildcard = true
		name = rest
	}
	norm, err := NormalizeName(name)
	if err != nil {
		return Rule{}, fmt.Errorf("allowlist entry %q: %v (use a name, *.suffix or an IP address)", s, err)
	}
	r.host = norm
	if r.wildcard {
		r.host = "." + norm
		norm = "*." + norm
	}
	r.Text = joinHostPort(norm, portText)
	return r, nil
}

func isIPOrNetwork(s string) bool {
	_, addrErr := netip.ParseAddr(s)
	_, prefixErr := netip.ParsePrefix(s)
	return addrErr == nil || prefixErr == nil
}

func joinHostPort(host, port string) string {
	if port == "" {
		return host
	}
	return net.JoinHostPort(host, port)
}

// ParsePort parses a TCP port number, 1-65535.
func ParsePort(s string) (int, error) {
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 || s[0] == '+' {
		return 0, fmt.Errorf("port %q is not a number in 1-65535", s)
	}
	return p, nil
}

// NormalizeName lowercases a DNS name, drops one trailing dot, and checks its syntax. Names
// whose last label is all digits are refused: they are IP addresses in disguise ("2130706433",
// "0x7f.1") that some resolvers would turn into addresses.
func NormalizeName(name string) (string, error) {
	n := strings.TrimSuffix(strings.ToLower(name), ".")
	if n == "" || len(n) > 253 {
		return "", fmt.Errorf("%q is not a valid host name", name)
	}
	labels := strings.Split(n, ".")
	for _, l := range labels {
		if len(l) == 0 || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return "", fmt.Errorf("%q is not a valid host name", name)
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", fmt.Errorf("%q is not a valid host name", name)
			}
		}
	}
	last := labels[len(labels)-1]
	if strings.Trim(last, "0123456789") == "" || strings.HasPrefix(last, "0x") {
		return "", fmt.Errorf("%q is not a valid host name (numeric top-level label)", name)
	}
	return n, nil
}

func (r Rule) allowsPort(port int) bool {
	if r.ports == nil {
		return true
	}
	for _, p := range r.ports {
		if p == port {
			return true
		}
	}
	return false
}

// Allowlist is an ordered list of rules; the first match names the decision.
type Allowlist struct {
	rules []Rule
}

// ParseAllowlist parses entries; blank entries are an error, so a stray comma cannot widen it.
func ParseAllowlist(entries []string) (*Allowlist, error) {
	a := &Allowlist{}
	for _, e := range entries {
		r, err := ParseRule(e)
		if err != nil {
			return nil, err
		}
		a.rules = append(a.rules, r)
	}
	return a, nil
}

// Addresses tells whether an IP or network rule names addr on port explicitly: a name that
// resolves to it may then be reached even if it is not public.
func (a *Allowlist) Addresses(addr netip.Addr, port int) bool {
	_, ok := a.Match(Dest{Host: addr.String(), Addr: addr, Port: port})
	return ok
}

// Private is the list with every rule marked Private (the job's GitLab instance).
func (a *Allowlist) Private() *Allowlist {
	out := &Allowlist{rules: slices.Clone(a.rules)}
	for i := range out.rules {
		out.rules[i].Private = true
	}
	return out
}

// With is the list with other's rules after its own.
func (a *Allowlist) With(other *Allowlist) *Allowlist {
	return &Allowlist{rules: slices.Concat(a.rules, other.rules)}
}

// Rules lists the rules' texts.
func (a *Allowlist) Rules() []string {
	out := make([]string, len(a.rules))
	for i, r := range a.rules {
		out[i] = r.Text
	}
	return out
}

// Dest is a destination a client asked for: a normalized name or an IP literal, and a port.
type Dest struct {
	Host string     // normalized name, or the address's text
	Addr netip.Addr // valid when the client asked for an IP literal
	Port int
}

func (d Dest) String() string { return net.JoinHostPort(d.Host, strconv.Itoa(d.Port)) }

// ParseDest parses "host:port" as a client wrote it (CONNECT authority, URL host);
// defaultPort applies when it has no port (0: a port is required).
func ParseDest(hostport string, defaultPort int) (Dest, error) {
	host, portText := hostport, ""
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		if p == "" {
			return Dest{}, fmt.Errorf("destination %q has an empty port", truncate(hostport, 300))
		}
		host, portText = h, p
	} else if defaultPort == 0 {
		return Dest{}, fmt.Errorf("destination %q has no port", truncate(hostport, 300))
	}
	if inner, ok := strings.CutPrefix(host, "["); ok && strings.HasSuffix(inner, "]") {
		host = strings.TrimSuffix(inner, "]") // "[::1]" without a port
	}
	if strings.ContainsAny(host, "[]") {
		return Dest{}, fmt.Errorf("destination %q has an unbalanced bracket", truncate(hostport, 300))
	}
	port := defaultPort
	if portText != "" {
		p, err := ParsePort(portText)
		if err != nil {
			return Dest{}, fmt.Errorf("destination %q: %v", truncate(hostport, 300), err)
		}
		port = p
	}
	addr, addrErr := netip.ParseAddr(host)
	if strings.HasPrefix(hostport, "[") && (addrErr != nil || !addr.Is6()) {
		return Dest{}, fmt.Errorf("destination %q: brackets hold an IPv6 address", truncate(hostport, 300))
	}
	if addrErr == nil {
		if addr.Zone() != "" {
			return Dest{}, fmt.Errorf("destination %q: IPv6 zones are not allowed", truncate(hostport, 300))
		}
		addr = addr.Unmap()
		return Dest{Host: addr.String(), Addr: addr, Port: port}, nil
	}
	name, err := NormalizeName(host)
	if err != nil {
		return Dest{}, fmt.Errorf("destination: %v", truncateErr(err))
	}
	return Dest{Host: name, Port: port}, nil
}

// Match returns the first rule that allows d. IP literals match only IP and network rules,
// names only name rules: a name is never allowed because of the address it resolves to, nor
// the reverse.
func (a *Allowlist) Match(d Dest) (Rule, bool) {
	for _, r := range a.rules {
		if !r.allowsPort(d.Port) {
			continue
		}
		switch {
		case d.Addr.IsValid() || r.prefix.IsValid():
			if d.Addr.IsValid() && r.prefix.IsValid() && r.prefix.Contains(d.Addr) {
				return r, true
			}
		case r.wildcard:
			if strings.HasSuffix(d.Host, r.host) {
				return r, true
			}
		case d.Host == r.host:
			return r, true
		}
	}
	return Rule{}, false
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

func truncateErr(err error) string { return truncate(err.Error(), 300) }
