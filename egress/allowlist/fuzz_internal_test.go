package allowlist

import (
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
)

// FuzzParseAllowlist: entries (one a line) parse without panicking, and a rule's normalized
// text parses back to itself, so that what the log names is what matches.
func FuzzParseAllowlist(f *testing.F) {
	// The seed corpus is testdata/fuzz/FuzzParseAllowlist.
	f.Fuzz(func(t *testing.T, text string) {
		entries := strings.Split(text, "\n")
		a, err := ParseAllowlist(entries)
		if err != nil {
			if strings.Contains(err.Error(), "\n") && !strings.Contains(text, "\n") {
				t.Errorf("multi-line error for %q: %q", text, err)
			}
			return
		}
		for _, rule := range a.rules {
			again, err := ParseRule(rule.Text)
			if err != nil || again.Text != rule.Text {
				t.Errorf("rule %q normalized to %q, which parses to %q, %v", text, rule.Text, again.Text, err)
			}
			if rule.prefix.IsValid() == (rule.host != "") {
				t.Errorf("rule %q is both or neither a name and an address: %+v", rule.Text, rule)
			}
		}
	})
}

// FuzzParseDest: a destination a client wrote (CONNECT authority, URL host) parses to one that
// prints and parses back to itself; an address is unmapped and zoneless, a name normalized;
// brackets are an IPv6 address's, balanced.
func FuzzParseDest(f *testing.F) {
	// The seed corpus is testdata/fuzz/FuzzParseDest.
	f.Fuzz(func(t *testing.T, hostport string, defaultPort int) {
		if defaultPort < 0 || defaultPort > 65535 {
			return
		}
		d, err := ParseDest(hostport, defaultPort)
		if err != nil {
			return
		}
		if d.Port < 1 || d.Port > 65535 {
			t.Fatalf("ParseDest(%q) port %d", hostport, d.Port)
		}
		if d.Addr.IsValid() {
			if d.Addr.Is4In6() || d.Addr.Zone() != "" || d.Host != d.Addr.String() {
				t.Fatalf("ParseDest(%q) = %+v: not an unmapped, zoneless address", hostport, d)
			}
		} else if norm, err := NormalizeName(d.Host); err != nil || norm != d.Host {
			t.Fatalf("ParseDest(%q) = %+v: the name is not normalized", hostport, d)
		}
		again, err := ParseDest(d.String(), 0)
		if err != nil || again != d {
			t.Fatalf("ParseDest(%q) = %+v prints as %q, which parses to %+v, %v", hostport, d, d.String(), again, err)
		}
	})
}

// FuzzInstanceRules: a job's instance grant (CI_SERVER_URL, CI_SERVER_HOST) parses as an
// allowlist and allows nothing but the instance: its host (or address) on 80, 443 and the URL's
// own port, and with wildcard, for a name, the names below it; never any port, a network, or a
// wildcard of an address. A refusal is one line.
func FuzzInstanceRules(f *testing.F) {
	for _, c := range []struct {
		url, host string
		wildcard  bool
		probe     string
	}{
		{"https://gitlab.example.com", "gitlab.example.com", false, "gitlab.example.com:443"},
		{"https://GitLab.Example.com./", "", true, "x.gitlab.example.com:80"},
		{"http://10.99.1.7:8080", "10.99.1.7", true, "10.99.1.7:8080"},
		{"https://[::ffff:10.0.0.1]:8443", "", true, "10.0.0.1:8443"},
		{"https://[2001:db8::1]", "", true, "[2001:db8::1]:443"},
		{"https://gitlab.example.com:0443", "", true, "evilgitlab.example.com:443"},
		{"https://user@gitlab.example.com:1/x?y#z", "GITLAB.example.com", false, "gitlab.example.com:1"},
		{"https://10.0.0.0/8", "", true, "10.0.0.5:443"},
	} {
		f.Add(c.url, c.host, c.wildcard, c.probe)
	}
	f.Fuzz(func(t *testing.T, serverURL, serverHost string, wildcard bool, probe string) {
		rules, err := InstanceRules(serverURL, serverHost, wildcard)
		if err != nil {
			testutil.RequireOneLine(t, err, fmt.Sprintf("InstanceRules(%q, %q)", serverURL, serverHost))
			return
		}
		a, err := ParseAllowlist(rules)
		if err != nil {
			t.Fatalf("InstanceRules(%q) = %q, which does not parse: %v", serverURL, rules, err)
		}
		u, err := url.Parse(serverURL)
		if err != nil {
			t.Fatalf("InstanceRules accepted %q, which is no URL: %v", serverURL, err)
		}
		host := strings.ToLower(u.Hostname())
		if serverHost != "" && !strings.EqualFold(serverHost, host) {
			t.Fatalf("InstanceRules(%q, %q): CI_SERVER_HOST is not the URL's host", serverURL, serverHost)
		}
		addr, addrErr := netip.ParseAddr(host)
		name, _ := NormalizeName(host)
		ports := []int{80, 443}
		if p, err := strconv.Atoi(u.Port()); err == nil {
			ports = append(ports, p)
		}
		for _, r := range a.rules {
			if r.ports == nil || r.Private || r.wildcard && (!wildcard || addrErr == nil) ||
				r.prefix.IsValid() && (addrErr != nil || r.prefix != netip.PrefixFrom(addr.Unmap(), addr.Unmap().BitLen())) ||
				!r.prefix.IsValid() && (name == "" || r.host != name && r.host != "."+name) {
				t.Fatalf("InstanceRules(%q, %t) has %q: not the instance's", serverURL, wildcard, r.Text)
			}
		}
		d, err := ParseDest(probe, 443)
		if err != nil {
			return
		}
		if _, ok := a.Match(d); !ok {
			return
		}
		switch {
		case !slices.Contains(ports, d.Port):
			t.Fatalf("the grant of %q allows %s: another port", serverURL, d)
		case d.Addr.IsValid() && (addrErr != nil || d.Addr != addr.Unmap()):
			t.Fatalf("the grant of %q allows %s: another address", serverURL, d)
		case !d.Addr.IsValid() && d.Host != name && !(wildcard && strings.HasSuffix(d.Host, "."+name)):
			t.Fatalf("the grant of %q (wildcard %t) allows %s: another name", serverURL, wildcard, d)
		}
	})
}
