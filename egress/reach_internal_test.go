package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
)

// fakeResolver answers from a map of absolute names, the first answer once and later ones
// from rebind (a DNS rebinding attacker's second answer), and records the names asked.
type fakeResolver struct {
	addrs  map[string][]string
	rebind map[string][]string

	mu    sync.Mutex
	asked []string
}

func (r *fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	answer := r.addrs[host]
	if slicesContain(r.asked, host) && r.rebind[host] != nil {
		answer = r.rebind[host]
	}
	r.asked = append(r.asked, host)
	if answer == nil {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	out := make([]netip.Addr, len(answer))
	for i, a := range answer {
		out[i] = netip.MustParseAddr(a)
	}
	return out, nil
}

func slicesContain(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// errDialled stands for a connection: the test sees where the proxy dialled and stops there.
var errDialled = errors.New("dialled")

// dialRecorder records the addresses dialled.
type dialRecorder struct {
	mu     sync.Mutex
	dialed []string
}

func (d *dialRecorder) dial(_ context.Context, _, address string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dialed = append(d.dialed, address)
	return nil, errDialled
}

func (d *dialRecorder) take() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := d.dialed
	d.dialed = nil
	return out
}

// A name allowed by a rule reaches only public addresses: not the proxy's loopback, cloud
// metadata, the cluster's or the site's private networks (also behind NAT64 or IPv4-mapped),
// unless an IP or network rule names the address, or the rule is the job's instance (an
// on-premises GitLab), which may reach private addresses but never loopback or link-local.
func TestResolvedAddressesMustBePublicUnlessNamed(t *testing.T) {
	s := newStand(t, "*.example:443", "10.9.9.0/24:443")
	resolver := &fakeResolver{addrs: map[string][]string{
		"public.example.":    {"93.184.215.14"},
		"public6.example.":   {"2606:2800:21f:cb07:6820:80da:af6b:8b2c"},
		"meta.example.":      {"169.254.169.254"},
		"lo.example.":        {"127.0.0.1"},
		"rfc1918.example.":   {"10.1.2.3"},
		"cgnat.example.":     {"100.64.0.1"},
		"ula.example.":       {"fd00::1"},
		"nat64meta.example":  {"64:ff9b::a9fe:a9fe"},
		"nat64.example.":     {"64:ff9b::808:808"},
		"nat64meta.example.": {"64:ff9b::a9fe:a9fe"},
		"mapped.example.":    {"::ffff:10.0.0.1"},
		"reserved.example.":  {"240.0.0.1"},
		"mixed.example.":     {"93.184.215.14", "10.0.0.1"},
		"named.example.":     {"10.9.9.9"},
		"gitlab.corp.":       {"10.0.0.5"},
		"lo.gitlab.corp.":    {"127.0.0.1"},
		"npm.corp.":          {"10.0.0.6"},
	}}
	dials := &dialRecorder{}
	s.proxy.Resolver, s.proxy.dialContext = resolver, dials.dial
	s.proxy.Grants = &Grants{}
	now := time.Now()
	if err := s.proxy.Grants.Put(netip.MustParseAddr("127.0.0.1"), adminclient.Grant{Instance: []string{"gitlab.corp:443", "*.gitlab.corp:443"}, Allow: []string{"npm.corp:443"}, Until: now.Add(time.Hour)}, now); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, dialled string // "": refused as non-public
	}{
		{"public.example", "93.184.215.14:443"},
		{"public6.example", "[2606:2800:21f:cb07:6820:80da:af6b:8b2c]:443"},
		{"nat64.example", "[64:ff9b::808:808]:443"},
		{"meta.example", ""},
		{"lo.example", ""},
		{"rfc1918.example", ""},
		{"cgnat.example", ""},
		{"ula.example", ""},
		{"nat64meta.example", ""},
		{"mapped.example", ""},
		{"reserved.example", ""},
		{"mixed.example", ""}, // one bad address refuses the name
		{"named.example", "10.9.9.9:443"},
		{"gitlab.corp", "10.0.0.5:443"},
		{"lo.gitlab.corp", ""},
		{"npm.corp", ""}, // granted, but not the instance
	} {
		_, _, resp := s.connect(t, c.name+":443", "")
		b := body(t, resp)
		got := dials.take()
		if c.dialled == "" {
			if resp.StatusCode != http.StatusForbidden || !strings.Contains(b, adminclient.ReasonNonPublicIP) || len(got) != 0 {
				t.Errorf("CONNECT %s: %s %q, dialled %v; want it refused as non-public", c.name, resp.Status, b, got)
			}
			continue
		}
		if resp.StatusCode != http.StatusBadGateway || fmt.Sprint(got) != "["+c.dialled+"]" {
			t.Errorf("CONNECT %s: %s %q, dialled %v; want %s dialled", c.name, resp.Status, b, got, c.dialled)
		}
	}
	for _, name := range resolver.asked {
		if !strings.HasSuffix(name, ".") {
			t.Errorf("resolved %q: a relative name, open to the pod's search domains", name)
		}
	}
}

// The proxy resolves a name once and dials what it checked: a second answer (DNS rebinding to
// loopback) is never asked for, on either path.
func TestTheAddressCheckedIsTheAddressDialled(t *testing.T) {
	s := newStand(t, "rebind.example:*")
	resolver := &fakeResolver{
		addrs:  map[string][]string{"rebind.example.": {"93.184.215.14"}},
		rebind: map[string][]string{"rebind.example.": {"127.0.0.1"}},
	}
	dials := &dialRecorder{}
	s.proxy.Resolver, s.proxy.dialContext = resolver, dials.dial
	_, _, resp := s.connect(t, "rebind.example:443", "")
	body(t, resp)
	if got := dials.take(); fmt.Sprint(got) != "[93.184.215.14:443]" || len(resolver.asked) != 1 {
		t.Errorf("CONNECT: dialled %v after %d lookups, want the one address checked", got, len(resolver.asked))
	}
	resolver.asked = nil // a new request resolves anew
	resp, err := s.client().Get("http://rebind.example:8080/")
	if err != nil {
		t.Fatal(err)
	}
	body(t, resp)
	if got := dials.take(); fmt.Sprint(got) != "[93.184.215.14:8080]" || len(resolver.asked) != 1 {
		t.Errorf("GET: dialled %v after %d lookups, want the one address checked", got, len(resolver.asked))
	}
}

// The instance the runners are registered with (the config's instance, the chart's gitlab.url)
// may resolve to a private address: an on-premises GitLab by the name its admin gave it, which
// the job's helper uploads artifacts to. The same name under allow may not.
func TestTheConfiguredInstanceMayBePrivate(t *testing.T) {
	built, err := Config{Allow: []string{"npm.corp:443"}, Instance: []string{"gitlab.internal:443"}}.Build()
	if err != nil {
		t.Fatal(err)
	}
	s := newStand(t)
	s.proxy.Allowlist = s.proxy.Allowlist.With(built.Allowlist)
	dials := &dialRecorder{}
	s.proxy.Resolver = &fakeResolver{addrs: map[string][]string{"gitlab.internal.": {"10.0.0.7"}, "npm.corp.": {"10.0.0.6"}}}
	s.proxy.dialContext = dials.dial
	_, _, resp := s.connect(t, "gitlab.internal:443", "")
	if got := dials.take(); resp.StatusCode != http.StatusBadGateway || fmt.Sprint(got) != "[10.0.0.7:443]" {
		t.Errorf("CONNECT gitlab.internal:443: %s, dialled %v; want 10.0.0.7:443 dialled", resp.Status, got)
	}
	_, _, resp = s.connect(t, "npm.corp:443", "")
	if b := body(t, resp); resp.StatusCode != http.StatusForbidden || !strings.Contains(b, adminclient.ReasonNonPublicIP) || len(dials.take()) != 0 {
		t.Errorf("CONNECT npm.corp:443 (allow, private): %s %q; want it refused as non-public", resp.Status, b)
	}
}
