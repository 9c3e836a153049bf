package allowlist

import (
	"strings"
	"testing"
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
