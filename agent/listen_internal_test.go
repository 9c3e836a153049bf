package agent

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// bindLike binds a TCP socket to addr:port as a job process would to send from the agent's port:
// with SO_REUSEADDR, and with SO_REUSEPORT too when reusePort. It returns bind's error.
func bindLike(t *testing.T, addr netip.Addr, port int, reusePort bool) error {
	t.Helper()
	family := syscall.AF_INET
	var sa syscall.Sockaddr
	if addr.Is4() {
		sa = &syscall.SockaddrInet4{Port: port, Addr: addr.As4()}
	} else {
		family = syscall.AF_INET6
		sa6 := &syscall.SockaddrInet6{Port: port, Addr: addr.As16()}
		if addr.Zone() != "" {
			iface, err := net.InterfaceByName(addr.Zone())
			if err != nil {
				t.Fatal(err)
			}
			sa6.ZoneId = uint32(iface.Index)
		}
		sa = sa6
	}
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		t.Fatal(err)
	}
	if reusePort {
		if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, 0xf /* SO_REUSEPORT */, 1); err != nil {
			t.Fatal(err)
		}
	}
	return syscall.Bind(fd, sa)
}

// probeAddrs are the addresses a job might bind the agent's port on: every local address, the
// wildcards, and 127.0.0.2 (local on Linux through lo's /8, though no interface lists it).
func probeAddrs(t *testing.T) []netip.Addr {
	t.Helper()
	addrs := []netip.Addr{netip.IPv4Unspecified(), netip.MustParseAddr("127.0.0.2")}
	if hasIPv6() {
		addrs = append(addrs, netip.IPv6Unspecified())
	}
	for _, s := range localAddrs() {
		a := netip.MustParseAddr(s)
		if a.Is6() && !hasIPv6() {
			continue
		}
		addrs = append(addrs, a)
	}
	return addrs
}

func hasIPv6() bool {
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// Once the agent listens on its wildcard port, no other socket binds that port on any address
// of the host, with SO_REUSEADDR or SO_REUSEPORT: not to listen, not to connect from it. (Under
// Linux the wildcard listener alone refuses them and listenEvery's concrete listeners are
// skipped; under gVisor the concrete listeners are what refuses them: see listenEvery.)
func TestListenEveryHoldsThePortOnEveryAddress(t *testing.T) {
	ln, err := listenEvery(":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	for _, addr := range probeAddrs(t) {
		for _, reusePort := range []bool{false, true} {
			if err := bindLike(t, addr, port, reusePort); !errors.Is(err, syscall.EADDRINUSE) {
				t.Errorf("bind %s with SO_REUSEADDR (SO_REUSEPORT %v) beside the agent: %v, want EADDRINUSE", net.JoinHostPort(addr.String(), strconv.Itoa(port)), reusePort, err)
			}
		}
	}

	// Nor does a connection go out from it: the job's way to use the fence's reply rule.
	target, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	d := net.Dialer{Timeout: time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port},
		Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1) })
			return errors.Join(err, serr)
		}}
	if conn, err := d.Dial("tcp", target.Addr().String()); !errors.Is(err, syscall.EADDRINUSE) {
		if conn != nil {
			conn.Close()
		}
		t.Errorf("a connection from 127.0.0.1:%d beside the agent: %v, want EADDRINUSE", port, err)
	}

	// And the agent is reached on each address.
	for _, host := range []string{"127.0.0.1", "::1"} {
		if host == "::1" && !hasIPv6() {
			continue
		}
		assertServed(t, ln, net.JoinHostPort(host, strconv.Itoa(port)))
	}
}

// A listener on a concrete address holds it against a SO_REUSEADDR bind by itself: what
// listenEvery adds beside the wildcard, shown here beside a concrete first listener, as Linux
// refuses concrete listeners beside a wildcard one.
func TestListenAlsoHoldsEachConcreteAddress(t *testing.T) {
	first, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	also := []string{"127.0.0.2", "127.0.0.3"}
	ln, err := listenAlso(first, also)
	if err != nil {
		first.Close()
		t.Fatal(err)
	}
	defer ln.Close()
	m, ok := ln.(*multiListener)
	if !ok || len(m.lns) != 3 {
		t.Fatalf("listenAlso gave %T, want the first listener and one on each of %v", ln, also)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	for _, host := range append([]string{"127.0.0.1"}, also...) {
		if err := bindLike(t, netip.MustParseAddr(host), port, false); !errors.Is(err, syscall.EADDRINUSE) {
			t.Errorf("bind %s:%d with SO_REUSEADDR beside the agent's listener: %v, want EADDRINUSE", host, port, err)
		}
		assertServed(t, ln, net.JoinHostPort(host, strconv.Itoa(port)))
	}
	if err := bindLike(t, netip.MustParseAddr("127.0.0.4"), port, false); err != nil {
		t.Errorf("an address the agent does not hold: bind %v, want success (the check above proves nothing otherwise)", err)
	}

	// An address in use is skipped, not fatal: under Linux, the wildcard listener's own.
	busy, err := net.Listen("tcp", "127.0.0.5:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	other, err := net.Listen("tcp", "127.0.0.6:"+strconv.Itoa(busy.Addr().(*net.TCPAddr).Port))
	if err != nil {
		t.Fatal(err)
	}
	got, err := listenAlso(other, []string{"127.0.0.5"})
	if err != nil || got != other {
		t.Errorf("listenAlso beside a listener in use: %v, %v; want the first listener alone", got, err)
	}
	other.Close()

	ln.Close()
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
	}
	for _, host := range append([]string{"127.0.0.1"}, also...) {
		if conn, err := net.DialTimeout("tcp", net.JoinHostPort(host, strconv.Itoa(port)), time.Second); err == nil {
			conn.Close()
			t.Errorf("%s:%d still accepts after Close", host, port)
		}
	}
}

func TestListenEveryOfAConcreteAddressIsThatAddressOnly(t *testing.T) {
	ln, err := listenEvery("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, ok := ln.(*net.TCPListener); !ok {
		t.Errorf("listenEvery(127.0.0.1:0) = %T, want a plain TCP listener", ln)
	}
}

// assertServed connects to addr and expects ln to accept it.
func assertServed(t *testing.T, ln net.Listener, addr string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Errorf("connect %s: %v", addr, err)
		return
	}
	defer conn.Close()
	got := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, err = io.WriteString(c, "x")
			c.Close()
		}
		got <- err
	}()
	select {
	case err := <-got:
		if err != nil {
			t.Errorf("accept from %s: %v", addr, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("the listener accepted nothing from %s", addr)
	}
}
