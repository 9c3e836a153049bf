package egress

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/egress/allowlist"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
)

// stand is a proxy on loopback with upstreams behind names of its hosts map.
type stand struct {
	proxy    *Proxy
	srv      *httptest.Server
	log      *testutil.LockedBuffer // the proxy's JSON log, written from its handlers
	web      *httptest.Server       // plain HTTP upstream, "web.test"
	webPort  int
	echoAddr *net.TCPAddr // raw TCP echo upstream, "echo.test"
}

func newStand(t testing.TB, allow ...string) *stand {
	t.Helper()
	s := &stand{log: &testutil.LockedBuffer{}}
	s.web = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "upstream got %s %s host=%s proxy-auth=%q", r.Method, r.URL.Path, r.Host, r.Header.Get("Proxy-Authorization"))
	}))
	t.Cleanup(s.web.Close)
	s.webPort = s.web.Listener.Addr().(*net.TCPAddr).Port
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { echo.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	s.echoAddr = echo.Addr().(*net.TCPAddr)
	entries := append([]string{"web.test:" + strconv.Itoa(s.webPort), "*.echo.test:*"}, allow...)
	s.proxy = &Proxy{
		Allowlist: mustAllowlist(t, entries...),
		Hosts:     map[string]netip.Addr{"web.test": netip.MustParseAddr("127.0.0.1"), "a.echo.test": netip.MustParseAddr("127.0.0.1")},
		Recorder:  &Recorder{Out: s.log},
	}
	s.srv = httptest.NewServer(s.proxy)
	t.Cleanup(func() { s.srv.Close(); s.proxy.Close() })
	return s
}

func (s *stand) client() *http.Client {
	u, _ := url.Parse(s.srv.URL)
	return &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(u), DisableKeepAlives: true}}
}

// connect sends a CONNECT and returns the connection and the proxy's answer.
func (s *stand) connect(t testing.TB, authority string, early string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	c, err := net.Dial("tcp", s.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n%s", authority, authority, early)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	return c, br, resp
}

func body(t *testing.T, r *http.Response) string {
	t.Helper()
	if r.Request != nil && r.Request.Method == http.MethodConnect && r.StatusCode == http.StatusOK {
		return "<an open tunnel>" // its "body" never ends
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestConnectTunnelEndToEnd(t *testing.T) {
	s := newStand(t)
	dest := "a.echo.test:" + strconv.Itoa(s.echoAddr.Port)
	// Bytes sent right behind the CONNECT, before the 200, must reach the upstream too.
	c, br, resp := s.connect(t, dest, "early-")
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT %s: %s", dest, resp.Status)
	}
	io.WriteString(c, "then-more")
	c.(*net.TCPConn).CloseWrite() // the half-close travels through: the echo server ends, so do we
	got, err := io.ReadAll(br)
	if err != nil || string(got) != "early-then-more" {
		t.Fatalf("through the tunnel: %q %v", got, err)
	}
	if !strings.Contains(s.log.String(), `"method":"CONNECT","dest":"`+dest+`","allowed":true,"rule":"*.echo.test:*"`) {
		t.Errorf("decision log: %s", s.log.String())
	}
}

// A real client (Go's, like curl with HTTPS_PROXY) speaks TLS through the tunnel.
func TestHTTPSThroughTunnel(t *testing.T) {
	s := newStand(t)
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "tls upstream") }))
	defer tlsSrv.Close()
	port := tlsSrv.Listener.Addr().(*net.TCPAddr).Port
	s.proxy.Hosts["tls.echo.test"] = netip.MustParseAddr("127.0.0.1")
	hc := s.client()
	tlsConf := tlsSrv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	tlsConf.ServerName = "example.com" // what httptest's certificate names
	hc.Transport.(*http.Transport).TLSClientConfig = tlsConf
	resp, err := hc.Get("https://tls.echo.test:" + strconv.Itoa(port) + "/")
	if err != nil {
		t.Fatal(err)
	}
	if b := body(t, resp); b != "tls upstream" {
		t.Errorf("body %q", b)
	}
}

func TestPlainHTTPForwarding(t *testing.T) {
	s := newStand(t)
	req, _ := http.NewRequest(http.MethodGet, "http://web.test:"+strconv.Itoa(s.webPort)+"/some/path", nil)
	u, _ := url.Parse(s.srv.URL)
	u.User = url.UserPassword("user", "proxy-secret")
	hc := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(u), DisableKeepAlives: true}}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	want := "upstream got GET /some/path host=web.test:" + strconv.Itoa(s.webPort) + ` proxy-auth=""`
	if b := body(t, resp); resp.StatusCode != 200 || b != want {
		t.Errorf("%s %q, want %q (no proxy credentials)", resp.Status, b, want)
	}
	// The URL decides, not a Host header naming another site: the upstream gets the checked host.
	c, err := net.Dial("tcp", s.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET http://web.test:%d/fronted HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n", s.webPort)
	resp, err = http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if b := body(t, resp); !strings.Contains(b, "GET /fronted host=web.test:"+strconv.Itoa(s.webPort)) {
		t.Errorf("Host header evil.example: upstream got %q", b)
	}
}

func TestBlockedRequestsGet403NamingTheDestination(t *testing.T) {
	s := newStand(t)
	// CONNECT to a name not in the allowlist.
	_, _, resp := s.connect(t, "evil.example:443", "")
	if b := body(t, resp); resp.StatusCode != 403 || !strings.Contains(b, "egress proxy: CONNECT evil.example:443 blocked: not in the allowlist") {
		t.Errorf("CONNECT evil.example:443: %s %q", resp.Status, b)
	}
	// An allowed name on another port.
	_, _, resp = s.connect(t, "web.test:22", "")
	if b := body(t, resp); resp.StatusCode != 403 || !strings.Contains(b, "CONNECT web.test:22 blocked") {
		t.Errorf("CONNECT web.test:22: %s %q", resp.Status, b)
	}
	// Plain HTTP.
	resp, err := s.client().Get("http://evil.example/x")
	if err != nil {
		t.Fatal(err)
	}
	if b := body(t, resp); resp.StatusCode != 403 || !strings.Contains(b, "GET evil.example:80 blocked: not in the allowlist") {
		t.Errorf("GET http://evil.example/x: %s %q", resp.Status, b)
	}
	// An IP literal of an allowed name's address is not allowed.
	resp, err = s.client().Get("http://127.0.0.1:" + strconv.Itoa(s.webPort) + "/")
	if err != nil {
		t.Fatal(err)
	}
	if b := body(t, resp); resp.StatusCode != 403 || !strings.Contains(b, "GET 127.0.0.1:"+strconv.Itoa(s.webPort)+" blocked") {
		t.Errorf("IP literal: %s %q", resp.Status, b)
	}
	got := dests(s.proxy.Recorder.Blocked(netip.MustParseAddr("127.0.0.1"), time.Time{}))
	if want := "evil.example:443,web.test:22,evil.example:80,127.0.0.1:" + strconv.Itoa(s.webPort); got != want {
		t.Errorf("recorded blocked %s, want %s", got, want)
	}
}

func TestIPLiteralAllowedOnlyWhenListed(t *testing.T) {
	s := newStand(t)
	port := strconv.Itoa(s.echoAddr.Port)
	_, _, resp := s.connect(t, "127.0.0.1:"+port, "")
	if resp.StatusCode != 403 {
		t.Fatalf("unlisted IP literal: %s", resp.Status)
	}
	s = newStand(t, "127.0.0.1:*")
	port = strconv.Itoa(s.echoAddr.Port)
	_, _, resp = s.connect(t, "127.0.0.1:"+port, "")
	if resp.StatusCode != 200 {
		t.Fatalf("listed IP literal: %s", resp.Status)
	}
}

// A name resolved by DNS (here: localhost, from the resolver) must not lead to the proxy's own
// loopback; an allowed but unreachable destination is a 502, not a 403.
func TestResolvedLoopbackAndUnreachable(t *testing.T) {
	lo := newStand(t, "localhost:*")
	lo.proxy.Resolver = &fakeResolver{addrs: map[string][]string{"localhost.": {"127.0.0.1"}}}
	_, _, resp := lo.connect(t, "localhost:"+strconv.Itoa(lo.echoAddr.Port), "")
	if b := body(t, resp); resp.StatusCode != 403 || !strings.Contains(b, "resolves to a non-public address") {
		t.Errorf("CONNECT localhost: %s %q", resp.Status, b)
	}
	resp, err := lo.client().Get("http://localhost:" + strconv.Itoa(lo.webPort) + "/")
	if err != nil {
		t.Fatal(err)
	}
	if b := body(t, resp); resp.StatusCode != 403 || !strings.Contains(b, "GET localhost:"+strconv.Itoa(lo.webPort)+" blocked: its name resolves to a non-public address") {
		t.Errorf("GET http://localhost: %s %q", resp.Status, b)
	}
	s := newStand(t, "127.0.0.1:*")
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := ln.Addr().String()
	ln.Close()
	_, _, resp = s.connect(t, closed, "")
	if b := body(t, resp); resp.StatusCode != 502 || !strings.Contains(b, "is allowed (rule 127.0.0.1:*) but unreachable") {
		t.Errorf("CONNECT %s (closed): %s %q", closed, resp.Status, b)
	}
	resp, err = s.client().Get("http://" + closed + "/")
	if err != nil {
		t.Fatal(err)
	}
	if b := body(t, resp); resp.StatusCode != 502 || !strings.Contains(b, "unreachable") {
		t.Errorf("GET http://%s: %s %q", closed, resp.Status, b)
	}
	if !strings.Contains(s.log.String(), `"allowed":true,"rule":"127.0.0.1:*","error":"dial tcp `+closed) {
		t.Errorf("the unreachable destination's log line lacks the error: %s", s.log.String())
	}
}

func TestNotAProxyRequest(t *testing.T) {
	s := newStand(t)
	resp, err := http.Get(s.srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	if b := body(t, resp); resp.StatusCode != 400 || !strings.Contains(b, "this is a forward proxy") {
		t.Errorf("GET /: %s %q", resp.Status, b)
	}
	_, _, resp = s.connect(t, "no-port.example", "")
	if b := body(t, resp); resp.StatusCode != 400 || !strings.Contains(b, `has no port`) {
		t.Errorf("CONNECT without port: %s %q", resp.Status, b)
	}
}

// Close cuts open tunnels (http.Server.Shutdown does not know hijacked connections).
func TestCloseCutsTunnels(t *testing.T) {
	s := newStand(t)
	c, br, resp := s.connect(t, "a.echo.test:"+strconv.Itoa(s.echoAddr.Port), "")
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	s.proxy.Close()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("read after Close: %v, want EOF", err)
	}
}

// What a tunnel costs: opening a connection and one 1-byte round trip, directly vs through a
// CONNECT tunnel; then round trips on an open connection (go test -bench . ./egress).
func BenchmarkTunnel(b *testing.B) {
	s := newStand(b)
	echo := s.echoAddr.String()
	dest := "a.echo.test:" + strconv.Itoa(s.echoAddr.Port)
	open := map[string]func() net.Conn{
		"direct": func() net.Conn {
			c, err := net.Dial("tcp", echo)
			if err != nil {
				b.Fatal(err)
			}
			return c
		},
		"tunnel": func() net.Conn {
			c, br, resp := s.connect(b, dest, "")
			if resp.StatusCode != 200 || br.Buffered() != 0 {
				b.Fatal(resp.Status)
			}
			return c
		},
	}
	ping := func(c net.Conn) {
		var one [1]byte
		if _, err := c.Write(one[:]); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, one[:]); err != nil {
			b.Fatal(err)
		}
	}
	for _, via := range []string{"direct", "tunnel"} {
		b.Run("open+roundtrip/"+via, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				c := open[via]()
				ping(c)
				c.Close()
			}
		})
		b.Run("stream64KiB/"+via, func(b *testing.B) {
			c := open[via]()
			defer c.Close()
			chunk := make([]byte, 64<<10)
			b.SetBytes(int64(len(chunk)))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := c.Write(chunk); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, chunk); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("roundtrip/"+via, func(b *testing.B) {
			c := open[via]()
			defer c.Close()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				ping(c)
			}
		})
	}
}

func mustAllowlist(t testing.TB, entries ...string) *allowlist.Allowlist {
	t.Helper()
	a, err := allowlist.ParseAllowlist(entries)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
