package egress

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
)

// upstreams is an HTTP upstream behind the stand's proxy, "up.echo.test": a request with
// "Upgrade: echo" is answered 101 and then echoed byte for byte; any other request has its body
// read to the end before the answer. started gets each request's path when its handler starts.
type upstreams struct {
	authority string // up.echo.test:port
	started   chan string
}

func newUpstreams(t *testing.T, s *stand) *upstreams {
	t.Helper()
	u := &upstreams{started: make(chan string, 64)}
	var mu sync.Mutex
	var hijacked []net.Conn
	var wg sync.WaitGroup
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.started <- r.URL.Path
		if strings.HasPrefix(r.URL.Path, "/early") {
			io.WriteString(w, "answered before the body")
			return
		}
		if r.Header.Get("Upgrade") != "echo" {
			b, err := io.ReadAll(r.Body)
			if err != nil {
				return
			}
			fmt.Fprintf(w, "read %d bytes", len(b))
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		mu.Lock()
		hijacked = append(hijacked, c)
		mu.Unlock()
		wg.Add(1)
		defer wg.Done()
		defer c.Close()
		io.WriteString(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		brw.Flush()
		io.Copy(c, brw)
	}))
	t.Cleanup(func() {
		srv.Close()
		mu.Lock()
		for _, c := range hijacked {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	s.proxy.Hosts["up.echo.test"] = netip.MustParseAddr("127.0.0.1")
	u.authority = "up.echo.test:" + strconv.Itoa(srv.Listener.Addr().(*net.TCPAddr).Port)
	return u
}

// dialProxy opens a connection to the stand's proxy, closed when the test ends.
func (s *stand) dialProxy(t *testing.T) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", s.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// upgrade asks the proxy to forward an upgrade to the upstream; it returns the connection and
// the proxy's answer (101 when the upgrade went through).
func (u *upstreams) upgrade(t *testing.T, s *stand, path string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	c := s.dialProxy(t)
	fmt.Fprintf(c, "GET http://%s%s HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n", u.authority, path, u.authority)
	br := bufio.NewReader(c)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodGet})
	if err != nil {
		t.Fatalf("upgrade %s: %v", path, err)
	}
	c.SetReadDeadline(time.Time{})
	if resp.StatusCode != http.StatusSwitchingProtocols {
		resp.Body.Close()
		return c, br, resp
	}
	select {
	case got := <-u.started: // sent before the upstream's 101
		if got != path {
			t.Fatalf("upstream started %s, want %s", got, path)
		}
	default:
		t.Fatalf("upgrade %s: 101 without the upstream", path)
	}
	return c, br, resp
}

// slowBody sends a forwarded POST whose body (1000 bytes announced) stops after 10 bytes. It
// returns the connection and, when the proxy answered before the upstream got the request, the
// answer; nil means the request is held open, its upstream handler started.
func (u *upstreams) slowBody(t *testing.T, s *stand, path string) (net.Conn, *http.Response) {
	t.Helper()
	c := s.dialProxy(t)
	fmt.Fprintf(c, "POST http://%s%s HTTP/1.1\r\nHost: %s\r\nContent-Length: 1000\r\n\r\n0123456789", u.authority, path, u.authority)
	answered := make(chan *http.Response, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodPost})
		if err != nil {
			answered <- nil
			return
		}
		resp.Body.Close()
		answered <- resp
	}()
	select {
	case got := <-u.started:
		if got != path {
			t.Fatalf("upstream started %s, want %s", got, path)
		}
		return c, nil
	case resp := <-answered:
		if resp == nil {
			t.Fatalf("slow body %s: the connection ended without an answer", path)
		}
		return c, resp
	case <-time.After(5 * time.Second):
		t.Fatalf("slow body %s: neither answered nor forwarded in 5 s", path)
	}
	return nil, nil
}

// endedWithin tells whether the proxy ended c (EOF or reset) within d; a read that times out
// means it is still open.
func endedWithin(c net.Conn, br *bufio.Reader, d time.Duration) (bool, error) {
	c.SetReadDeadline(time.Now().Add(d))
	var err error
	if br != nil {
		_, err = br.ReadByte()
	} else {
		_, err = c.Read(make([]byte, 1))
	}
	return err != nil && !isTimeout(err), err
}

// Forwarded http:// requests count against MaxTunnelsPerClient like CONNECT tunnels: upgraded
// ones (101) and ones whose body is still coming alike. Of 10 asked for with the cap at 2, 2 are
// held and 8 refused with 429, and one that ends gives its place back.
func TestForwardedConnectionsCountAgainstTheCap(t *testing.T) {
	s := newStand(t)
	s.proxy.MaxTunnelsPerClient = 2
	u := newUpstreams(t, s)
	var held, refused []string
	var firstUpgrade net.Conn
	for i := 0; i < 10; i++ {
		path := "/" + strconv.Itoa(i)
		var resp *http.Response
		if i%2 == 0 {
			var c net.Conn
			c, _, resp = u.upgrade(t, s, path)
			if resp.StatusCode == http.StatusSwitchingProtocols {
				resp = nil
				if firstUpgrade == nil {
					firstUpgrade = c
				}
			}
		} else {
			_, resp = u.slowBody(t, s, path)
		}
		switch {
		case resp == nil:
			held = append(held, path)
		case resp.StatusCode == http.StatusTooManyRequests:
			refused = append(refused, path)
		default:
			t.Fatalf("%s: %s, want 101, a held request or 429", path, resp.Status)
		}
	}
	if len(held) != 2 || len(refused) != 8 {
		t.Fatalf("with max_tunnels_per_client 2: held %d %v, refused %d %v; want 2 held, 8 refused", len(held), held, len(refused), refused)
	}
	blocked := s.proxy.Recorder.Blocked(netip.MustParseAddr("127.0.0.1"), time.Time{})
	if len(blocked.Blocked) != 8 {
		t.Errorf("recorded blocked: %+v, want the 8 refused", blocked.Blocked)
	}
	for _, d := range blocked.Blocked {
		if d.Reason != adminclient.ReasonTooManyTunnels {
			t.Errorf("recorded blocked: %+v, want reason %q", d, adminclient.ReasonTooManyTunnels)
		}
	}
	// A CONNECT tunnel is refused too: the cap is on all of a client's connections.
	if _, _, resp := s.connect(t, "a.echo.test:"+strconv.Itoa(s.echoAddr.Port), ""); resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("CONNECT beside 2 held forwards: %s, want 429", resp.Status)
	}
	firstUpgrade.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, _, resp := u.upgrade(t, s, "/again")
		if resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a closed upgrade did not give its place back: %s", resp.Status)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A forwarded request that moved nothing either way for TunnelIdleTimeout is ended, upgraded
// (101) or waiting for the rest of its body; an upgraded one that carries bytes is not.
func TestIdleForwardedConnectionsAreClosed(t *testing.T) {
	s := newStand(t)
	s.proxy.TunnelIdleTimeout = 100 * time.Millisecond
	u := newUpstreams(t, s)
	upgraded, br, resp := u.upgrade(t, s, "/idle-upgrade")
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %s", resp.Status)
	}
	slow, resp := u.slowBody(t, s, "/idle-body")
	if resp != nil {
		t.Fatalf("slow body: %s, want it forwarded", resp.Status)
	}
	start := time.Now()
	if ended, err := endedWithin(upgraded, br, 2*time.Second); !ended {
		t.Errorf("an idle upgraded connection is open after 2s (idle timeout 100ms): %v", err)
	}
	if ended, err := endedWithin(slow, nil, 2*time.Second-time.Since(start)); !ended {
		t.Errorf("an idle request body is open after 2s (idle timeout 100ms): %v", err)
	}
	// The upstream answers before the body's end: the server reads the rest before passing the
	// answer on, under the idle clock too.
	early, resp := u.slowBody(t, s, "/early")
	if resp != nil {
		t.Fatalf("slow body: %s, want it forwarded", resp.Status)
	}
	if ended, err := endedWithin(early, nil, 2*time.Second); !ended {
		t.Errorf("an idle request body answered early is open after 2s (idle timeout 100ms): %v", err)
	}

	// Echo a byte every 30 ms for 420 ms through an upgrade: never idle, never cut.
	busy, br, resp := u.upgrade(t, s, "/busy")
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %s", resp.Status)
	}
	busy.SetReadDeadline(time.Now().Add(5 * time.Second))
	for i := 0; i < 14; i++ {
		time.Sleep(30 * time.Millisecond)
		if _, err := busy.Write([]byte{'x'}); err != nil {
			t.Fatalf("busy upgrade cut after %d bytes: %v", i, err)
		}
		if _, err := br.ReadByte(); err != nil {
			t.Fatalf("busy upgrade cut after %d bytes: %v", i, err)
		}
	}
}

// Close ends forwarded requests in flight, upgraded or not, as it ends tunnels, and the proxy
// forwards nothing after it.
func TestCloseEndsForwardedConnections(t *testing.T) {
	s := newStand(t)
	u := newUpstreams(t, s)
	upgraded, br, resp := u.upgrade(t, s, "/upgrade")
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %s", resp.Status)
	}
	slow, resp := u.slowBody(t, s, "/body")
	if resp != nil {
		t.Fatalf("slow body: %s, want it forwarded", resp.Status)
	}
	s.proxy.Close()
	start := time.Now()
	if ended, err := endedWithin(upgraded, br, 2*time.Second); !ended {
		t.Errorf("an upgraded connection is open 2s after Close: %v", err)
	}
	if ended, err := endedWithin(slow, nil, 2*time.Second-time.Since(start)); !ended {
		t.Errorf("a request body in flight is open 2s after Close: %v", err)
	}
	_, _, resp = u.upgrade(t, s, "/after")
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("an upgrade after Close: %s, want 503", resp.Status)
	}
}

// Forwarded requests with bodies keep their connection alive for the next; a request answered
// by the proxy itself closes its connection rather than wait for a body nothing reads.
func TestForwardedBodiesAndKeepAlive(t *testing.T) {
	s := newStand(t)
	u := newUpstreams(t, s)
	c := s.dialProxy(t)
	br := bufio.NewReader(c)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	for i, sent := range []string{"first body", "the second"} {
		fmt.Fprintf(c, "POST http://%s/keep HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n%s", u.authority, u.authority, len(sent), sent)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodPost})
		if err != nil {
			t.Fatalf("request %d on one connection: %v", i, err)
		}
		if b := body(t, resp); resp.StatusCode != http.StatusOK || b != "read 10 bytes" || resp.Close {
			t.Errorf("request %d: %s %q close=%v, want 200 \"read 10 bytes\" kept alive", i, resp.Status, b, resp.Close)
		}
	}
	// Not allowed, its body announced and not sent: answered at once, and the connection closed.
	fmt.Fprintf(c, "POST http://evil.example/ HTTP/1.1\r\nHost: evil.example\r\nContent-Length: 1000\r\n\r\nabc")
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodPost})
	if err != nil {
		t.Fatal(err)
	}
	if b := body(t, resp); resp.StatusCode != http.StatusForbidden || !resp.Close {
		t.Errorf("refused with a body to come: %s %q close=%v, want 403 and Connection: close", resp.Status, b, resp.Close)
	}
	if ended, err := endedWithin(c, br, 2*time.Second); !ended {
		t.Errorf("the refused request's connection is open after 2s: %v", err)
	}
}
