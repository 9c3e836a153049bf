package agent

import (
	"errors"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
)

// listenEvery listens on addr and, when addr's host is a wildcard ("", 0.0.0.0 or ::), also on
// its port of every concrete address of the pod's interfaces (loopback included), and accepts
// from all of them as one listener.
//
// Why: the netstack fence lets packets out from the agent's ports (7543, 7544) to its clients'
// networks, so that the agent can answer them, and only the agent may hold those ports. Linux
// refuses any other socket an address of a port that a wildcard listener holds (EADDRINUSE, even
// with SO_REUSEADDR). gVisor's netstack does not: beside a wildcard listener it lets a socket
// with SO_REUSEADDR bind 127.0.0.1, ::1 or the pod's address on that port (its demuxer compares
// exact addresses) and connect out from there. A listener of the agent on each of those
// addresses closes that: netstack refuses a bind of an address and port a listener holds unless
// both set SO_REUSEPORT (Go's listeners do not), and refuses SO_REUSEADDR alone. Under Linux the
// concrete listeners fail with EADDRINUSE (the wildcard listener holds them already, for us as
// for anyone) and are skipped; so is an address that cannot be bound at all (EADDRNOTAVAIL: an
// IPv6 address still tentative). The addresses are read once, when the agent starts, before any
// job process runs: an address added to the pod later is not held.
func listenEvery(addr string) (net.Listener, error) {
	first, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil || !wildcardHost(host) {
		return first, nil
	}
	return listenAlso(first, localAddrs())
}

// listenAlso adds to first a listener on its port of each of addrs, skipping an address the
// kernel refuses as in use or not available, and accepts from all of them as one listener.
func listenAlso(first net.Listener, addrs []string) (net.Listener, error) {
	port := first.Addr().(*net.TCPAddr).Port
	lns := []net.Listener{first}
	for _, local := range addrs {
		ln, err := net.Listen("tcp", net.JoinHostPort(local, strconv.Itoa(port)))
		if errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EADDRNOTAVAIL) {
			continue
		}
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return nil, err
		}
		lns = append(lns, ln)
	}
	if len(lns) == 1 {
		return first, nil
	}
	return newMultiListener(lns), nil
}

func wildcardHost(host string) bool {
	if host == "" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsUnspecified()
}

// localAddrs are the concrete addresses of the host's (the pod's) interfaces, IPv6 link-local
// ones with their zone.
func localAddrs() []string {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil
	}
	var out []string
	for _, iface := range ifaces {
		addrs, err := iface.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			prefix, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(prefix.IP)
			if !ok || ip.IsUnspecified() || ip.IsMulticast() {
				continue
			}
			ip = ip.Unmap()
			if ip.Is6() && ip.IsLinkLocalUnicast() {
				ip = ip.WithZone(iface.Name)
			}
			out = append(out, ip.String())
		}
	}
	return out
}

// multiListener accepts from several listeners as one; Close closes them all.
type multiListener struct {
	lns   []net.Listener
	conns chan accepted
	done  chan struct{}
	once  sync.Once
}

type accepted struct {
	conn net.Conn
	err  error
}

func newMultiListener(lns []net.Listener) *multiListener {
	m := &multiListener{lns: lns, conns: make(chan accepted), done: make(chan struct{})}
	for _, ln := range lns {
		go m.accept(ln)
	}
	return m
}

func (m *multiListener) accept(ln net.Listener) {
	for {
		conn, err := ln.Accept()
		select {
		case m.conns <- accepted{conn, err}:
		case <-m.done:
			if conn != nil {
				conn.Close()
			}
			return
		}
		if err != nil {
			return
		}
	}
}

// Accept returns the next connection of any listener, or the first error one of them returns
// (the caller stops serving, as it would on one listener's error).
func (m *multiListener) Accept() (net.Conn, error) {
	select {
	case a := <-m.conns:
		return a.conn, a.err
	case <-m.done:
		return nil, net.ErrClosed
	}
}

func (m *multiListener) Close() error {
	var err error
	m.once.Do(func() {
		close(m.done)
		for _, ln := range m.lns {
			if e := ln.Close(); e != nil && err == nil {
				err = e
			}
		}
	})
	return err
}

// Addr is the first listener's: the address asked for.
func (m *multiListener) Addr() net.Addr { return m.lns[0].Addr() }
