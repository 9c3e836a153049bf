package allowlist

import (
	"net/netip"
	"strings"
	"testing"
)

func mustAllowlist(t testing.TB, entries ...string) *Allowlist {
	t.Helper()
	a, err := ParseAllowlist(entries)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestAllowlistMatch(t *testing.T) {
	a := mustAllowlist(t,
		"gitlab.example.com",    // 80 and 443
		"*.npm.example.org:443", // subdomains, 443 only
		"Git.Example.NET.:22",   // normalized
		"registry.example.io:*", // any port
		"10.99.1.2:80",          // IP literal
		"[2001:db8::1]:443",     // IPv6 literal
		"2001:db8::2",           // bare IPv6 literal: 80 and 443
	)
	cases := []struct {
		dest string
		rule string // "" = blocked
	}{
		{"gitlab.example.com:443", "gitlab.example.com"},
		{"gitlab.example.com:80", "gitlab.example.com"},
		{"GITLAB.example.com.:443", "gitlab.example.com"},
		{"gitlab.example.com:22", ""},
		{"evil.gitlab.example.com:443", ""}, // an exact rule does not cover subdomains
		{"gitlab.example.com.evil.test:443", ""},
		{"a.npm.example.org:443", "*.npm.example.org:443"},
		{"a.b.npm.example.org:443", "*.npm.example.org:443"},
		{"npm.example.org:443", ""}, // the wildcard does not cover its apex
		{"evilnpm.example.org:443", ""},
		{"a.npm.example.org:80", ""},
		{"git.example.net:22", "git.example.net:22"},
		{"registry.example.io:5000", "registry.example.io:*"},
		{"10.99.1.2:80", "10.99.1.2:80"},
		{"10.99.1.2:443", ""},
		{"10.99.0.2:80", ""},
		{"[::ffff:10.99.1.2]:80", "10.99.1.2:80"}, // IPv4-mapped is the same address
		{"[2001:db8::1]:443", "[2001:db8::1]:443"},
		{"[2001:db8:0::1]:443", "[2001:db8::1]:443"},
		{"[2001:db8::2]:80", "2001:db8::2"},
		{"[2001:db8::1]:80", ""},
	}
	for _, c := range cases {
		d, err := ParseDest(c.dest, 0)
		if err != nil {
			t.Errorf("ParseDest(%q): %v", c.dest, err)
			continue
		}
		r, ok := a.Match(d)
		if ok != (c.rule != "") || r.Text != c.rule {
			t.Errorf("%s: matched %v by %q, want %q", c.dest, ok, r.Text, c.rule)
		}
	}
}

// A name never matches an IP rule (nor the reverse), and wildcards never match addresses.
func TestAllowlistNamesAndAddressesDoNotMix(t *testing.T) {
	a := mustAllowlist(t, "10.0.0.1:443", "*.0.0.1.example.com:443", "localhost:443")
	for dest, want := range map[string]string{
		"127.0.0.1:443":            "", // not "localhost"
		"[::1]:443":                "",
		"10.0.0.1:443":             "10.0.0.1:443",
		"10.0.0.1.example.com:443": "*.0.0.1.example.com:443", // a name, however it looks
	} {
		d, err := ParseDest(dest, 0)
		if err != nil {
			t.Fatal(err)
		}
		if r, _ := a.Match(d); r.Text != want {
			t.Errorf("%s matched %q, want %q", dest, r.Text, want)
		}
	}
}

func TestParseRuleErrors(t *testing.T) {
	for _, bad := range []string{"", "*", "*.", "exa mple.com", "example.com:0", "example.com:65536", "example.com:http",
		"-bad.example.com", "example..com", "a.*.example.com", "2130706433", "0x7f.1", "[fe80::1%eth0]:443", "example.com:+80", "example.com:"} {
		if r, err := ParseRule(bad); err == nil {
			t.Errorf("ParseRule(%q) = %q, want an error", bad, r.Text)
		} else if !strings.Contains(err.Error(), "allowlist entry") {
			t.Errorf("ParseRule(%q): error does not name the entry: %v", bad, err)
		}
	}
}

func TestParseDest(t *testing.T) {
	if d, err := ParseDest("Example.COM", 80); err != nil || d.String() != "example.com:80" {
		t.Errorf("default port: %v %v", d, err)
	}
	for _, bad := range []string{"example.com", "example.com:", "A:", "[::1]:", "example.com:99999", "[fe80::1%25eth0]:443", "exa_mple com:80", "127.1:80", strings.Repeat("a", 300) + ".com:443"} {
		if d, err := ParseDest(bad, 0); err == nil {
			t.Errorf("ParseDest(%q) = %v, want an error", bad, d)
		} else if len(err.Error()) > 400 {
			t.Errorf("ParseDest(%q): error of %d bytes", bad, len(err.Error()))
		}
	}
}

// A network rule matches the addresses in it that a client asks for, and names them for
// resolved names (Addresses); never a name.
func TestNetworkRules(t *testing.T) {
	a := mustAllowlist(t, "10.1.2.0/24:443", "[fd00::/8]:*", "192.168.7.9/16")
	for dest, want := range map[string]string{
		"10.1.2.77:443":    "10.1.2.0/24:443",
		"10.1.3.1:443":     "",
		"10.1.2.77:80":     "",
		"[fd12::1]:22":     "[fd00::/8]:*",
		"192.168.200.1:80": "192.168.0.0/16",
		"ten.example:443":  "",
	} {
		d, err := ParseDest(dest, 0)
		if err != nil {
			t.Fatal(err)
		}
		if r, _ := a.Match(d); r.Text != want {
			t.Errorf("%s matched %q, want %q", dest, r.Text, want)
		}
	}
	if !a.Addresses(netip.MustParseAddr("10.1.2.3"), 443) || a.Addresses(netip.MustParseAddr("10.1.2.3"), 80) {
		t.Error("Addresses: 10.1.2.3 is named on 443 only")
	}
	if _, err := ParseRule("[::ffff:10.0.0.0/104]:443"); err == nil {
		t.Error("an IPv4 network written in IPv6 was accepted")
	}
}

// A bracket is an IPv6 literal's, balanced: ParseDest refuses one that is not, rather than
// trimming it into an address.
func TestParseDestRefusesUnbalancedBrackets(t *testing.T) {
	for _, bad := range []string{"[::1", "::1]", "[::1:443", "::1]:443", "[127.0.0.1", "[[::1]]:443", "[x.example]:443"} {
		if d, err := ParseDest(bad, 443); err == nil {
			t.Errorf("ParseDest(%q) = %v, want an error", bad, d)
		}
	}
	for in, want := range map[string]string{"[::1]": "[::1]:443", "[::1]:80": "[::1]:80"} {
		if d, err := ParseDest(in, 443); err != nil || d.String() != want {
			t.Errorf("ParseDest(%q) = %v, %v; want %s", in, d, err, want)
		}
	}
}
