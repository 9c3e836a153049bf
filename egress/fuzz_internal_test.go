package egress

import (
	"bufio"
	"context"
	"hash/fnv"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/egress/allowlist"
)

// FuzzConfig: any config file's contents are refused with one line or give a proxy that
// serves: an allowlist, and no network beyond loopback trusted without a token and TLS.
func FuzzConfig(f *testing.F) {
	// The seed corpus is testdata/fuzz/FuzzConfig.
	f.Fuzz(func(t *testing.T, data string) {
		b, err := ParseConfig("fuzz.toml", []byte(data))
		if err != nil {
			if msg := err.Error(); !strings.HasPrefix(msg, "config fuzz.toml: ") || strings.ContainsAny(msg, "\n") && !strings.ContainsAny(data, "\n") {
				t.Errorf("error %q does not name the file on one line", msg)
			}
			return
		}
		if b.Allowlist == nil || len(b.Allowlist.Rules()) == 0 || b.TunnelIdleTimeout <= 0 || b.Config.MaxTunnelsPerClient < 0 {
			t.Errorf("config %q built %+v", data, b)
		}
		for _, p := range b.Allow {
			if !isLoopback(p) && (b.Token == "" || b.AdminTLS == nil) {
				t.Errorf("config %q trusts %s without a token and TLS", data, p)
			}
		}
	})
}

// targetResolver answers every absolute name with one address picked from a mix of public and
// non-public ones by the name's hash, and a later lookup of the same name with loopback (a
// rebinding attacker); it records the lookups.
type targetResolver struct {
	mu      sync.Mutex
	answers map[string][]netip.Addr
	lookups int
}

var targetAddrs = []string{"93.184.215.14", "10.0.0.7", "127.0.0.1", "169.254.169.254", "100.64.1.1", "fd00::7",
	"2606:2800:21f:cb07:6820:80da:af6b:8b2c", "64:ff9b::a9fe:a9fe", "::ffff:8.8.8.8", "10.9.9.9"}

func (r *targetResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lookups++
	if _, seen := r.answers[host]; seen {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	h := fnv.New32a()
	h.Write([]byte(host))
	answer := []netip.Addr{netip.MustParseAddr(targetAddrs[h.Sum32()%uint32(len(targetAddrs))])}
	r.answers[host] = answer
	return answer, nil
}

// FuzzProxyTarget: whatever a client sends as a CONNECT authority or an absolute http:// URL,
// the proxy dials only an allowed destination, and for a resolved name only an address of its
// one lookup that passed the check: the address checked is the address dialled.
func FuzzProxyTarget(f *testing.F) {
	// The seed corpus is testdata/fuzz/FuzzProxyTarget.
	f.Fuzz(func(t *testing.T, target string, connect bool) {
		raw := "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n\r\n"
		if !connect {
			raw = "GET http://" + target + "/ HTTP/1.1\r\nHost: " + target + "\r\n\r\n"
		}
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
		if err != nil {
			return // the server would have refused it before the proxy saw it
		}
		req.RemoteAddr = "10.88.0.5:40000"
		resolver := &targetResolver{answers: map[string][]netip.Addr{}}
		dials := &dialRecorder{}
		p := &Proxy{
			Allowlist:   mustAllowlist(t, "*.example:*", "10.9.9.0/24:443", "[fd00::/8]:22"),
			Hosts:       map[string]netip.Addr{"host.example": netip.MustParseAddr("192.0.2.10")},
			Recorder:    &Recorder{},
			Resolver:    resolver,
			DialTimeout: time.Second,
			dialContext: dials.dial,
		}
		defer p.Close()
		w := httptest.NewRecorder()
		p.ServeHTTP(w, req)
		dialled := dials.take()
		if len(dialled) == 0 {
			return
		}
		if resolver.lookups > 1 {
			t.Fatalf("%q: %d lookups for one request", target, resolver.lookups)
		}
		for _, a := range dialled {
			ap, err := netip.ParseAddrPort(a)
			if err != nil {
				t.Fatalf("%q: dialled %q, not an address", target, a)
			}
			dest := allowlist.Dest{Host: ap.Addr().String(), Addr: ap.Addr(), Port: int(ap.Port())}
			allowedLiteral := p.Allowlist.Addresses(ap.Addr(), int(ap.Port()))
			fromHosts := ap.Addr() == netip.MustParseAddr("192.0.2.10")
			var resolved bool
			for _, answers := range resolver.answers {
				for _, r := range answers {
					resolved = resolved || r.Unmap() == ap.Addr()
				}
			}
			switch {
			case allowedLiteral, fromHosts:
			case resolved && reachOf(ap.Addr()) == public:
			default:
				t.Fatalf("%q (connect %t): dialled %s (%+v), which no rule allows and no lookup checked", target, connect, a, dest)
			}
		}
		if w.Code != http.StatusBadGateway && !strings.Contains(w.Body.String(), "unreachable") {
			t.Fatalf("%q: dialled %v but answered %d %q", target, dialled, w.Code, w.Body.String())
		}
	})
}
