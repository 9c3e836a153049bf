package egress

import (
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
)

// One client holds at most MaxTunnelsPerClient tunnels: the next is refused with 429 and
// recorded as blocked, and a tunnel that ends gives its place back.
func TestTunnelsPerClientAreCapped(t *testing.T) {
	s := newStand(t)
	s.proxy.MaxTunnelsPerClient = 2
	dest := "a.echo.test:" + strconv.Itoa(s.echoAddr.Port)
	first, _, resp := s.connect(t, dest, "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("first tunnel: %s", resp.Status)
	}
	if _, _, resp := s.connect(t, dest, ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("second tunnel: %s", resp.Status)
	}
	_, _, resp = s.connect(t, dest, "")
	if b := body(t, resp); resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(b, adminclient.ReasonTooManyTunnels) {
		t.Fatalf("third tunnel: %s %q, want 429 naming the limit", resp.Status, b)
	}
	blocked := s.proxy.Recorder.Blocked(netip.MustParseAddr("127.0.0.1"), time.Time{})
	if len(blocked.Blocked) != 1 || blocked.Blocked[0].Reason != adminclient.ReasonTooManyTunnels {
		t.Errorf("recorded blocked: %+v", blocked.Blocked)
	}
	first.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, _, resp := s.connect(t, dest, "")
		if resp.StatusCode == http.StatusOK {
			break
		}
		body(t, resp)
		if time.Now().After(deadline) {
			t.Fatalf("a closed tunnel did not give its place back: %s", resp.Status)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A tunnel that carries nothing either way for TunnelIdleTimeout is closed; one that carries
// bytes in one direction only (a download) is not.
func TestIdleTunnelsAreClosed(t *testing.T) {
	s := newStand(t)
	s.proxy.TunnelIdleTimeout = 100 * time.Millisecond
	idle, br, resp := s.connect(t, "a.echo.test:"+strconv.Itoa(s.echoAddr.Port), "")
	if resp.StatusCode != http.StatusOK {
		t.Fatal(resp.Status)
	}
	idle.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	if n, err := br.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("idle tunnel: read %d, %v; want it closed by the proxy", n, err)
	}
	if took := time.Since(start); took < 50*time.Millisecond { // the idle clock started a little before
		t.Errorf("closed after %s, before the idle timeout", took)
	}

	// A download: the upstream writes a byte every 30 ms for 400 ms; the client never writes.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		for i := 0; i < 14; i++ {
			time.Sleep(30 * time.Millisecond)
			if _, err := c.Write([]byte{'x'}); err != nil {
				return
			}
		}
	}()
	s.proxy.Hosts["download.echo.test"] = netip.MustParseAddr("127.0.0.1")
	down, br, resp := s.connect(t, "download.echo.test:"+strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), "")
	if resp.StatusCode != http.StatusOK {
		t.Fatal(resp.Status)
	}
	down.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, _ := io.ReadAll(br)
	<-done
	if len(got) != 14 {
		t.Errorf("the download got %d of 14 bytes before the tunnel closed", len(got))
	}
}
