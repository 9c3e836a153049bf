//go:build amd64 || arm64

package netfence

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/netnstest"
)

// netns is a thread in a network namespace of its own (netnstest.Thread), with the probes
// these tests make from it.
type netns struct{ *netnstest.Thread }

func newNetns(t *testing.T) *netns { return &netns{netnstest.New(t)} }

// connects reports whether a TCP connect from the namespace to addr succeeds.
func (ns *netns) connects(addr string, timeout time.Duration) error {
	return ns.connectsFrom("", addr, timeout)
}

// connectsFrom is connects from the local address from (any when empty).
func (ns *netns) connectsFrom(from, addr string, timeout time.Duration) error {
	return ns.connectsFromPort(from, 0, addr, timeout)
}

// connectsFromPort is connectsFrom with the local port port too (any when 0), bound with
// SO_REUSEADDR as a job would set it: a listener may then take the port while the connection
// lingers in TIME_WAIT.
func (ns *netns) connectsFromPort(from string, port int, addr string, timeout time.Duration) (err error) {
	d := net.Dialer{Timeout: timeout}
	if from != "" || port != 0 {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from), Port: port}
	}
	if port != 0 {
		d.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1) }); err != nil {
				return err
			}
			return serr
		}
	}
	ns.Do(func() {
		var c net.Conn
		if c, err = d.Dial("tcp", addr); err == nil {
			c.Close()
		}
	})
	return err
}

// echoes reports whether an ICMPv6 echo request from the namespace to addr (with its zone for a
// link-local or multicast address) gets an answer within timeout.
func (ns *netns) echoes(t *testing.T, addr string, timeout time.Duration) bool {
	t.Helper()
	var c net.PacketConn
	var err error
	ns.Do(func() { c, err = net.ListenPacket("ip6:ipv6-icmp", "::") })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dst, err := net.ResolveIPAddr("ip6", addr)
	if err != nil {
		t.Fatal(err)
	}
	// Type 128 (echo request), code 0, checksum (the kernel's), identifier, sequence, payload.
	request := []byte{128, 0, 0, 0, 0x5e, 0xc1, 0, 1, 'f', 'e', 'n', 'c', 'e'}
	if _, err := c.WriteTo(request, dst); err != nil {
		return false // dropped by the fence: EPERM
	}
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 1500)
	for {
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			return false
		}
		if n >= 8 && buf[0] == 129 && buf[4] == 0x5e && buf[5] == 0xc1 { // echo reply, ours
			return true
		}
	}
}

// fencedPair is a fresh network namespace joined by a veth pair to a peer namespace, with
// listeners on both sides.
type fencedPair struct {
	fenced, peer *netns
}

// newFencedPair makes the namespaces: the fenced one is 10.201.0.1 and fd00:201::1; the peer is
// .2 and .3 of each, listening on 8443 and 8444; the fenced one listens on 9000, on the agent's
// first port and on 9001. The peer is the fenced one's IPv6 gateway too: fe80::2 (and fe80::3,
// no gateway) on the link, fd00:202::2 behind it; fd00:203::/64 goes through fe80::2 or fe80::4
// (nobody), a multipath route.
func newFencedPair(t *testing.T) fencedPair {
	t.Helper()
	p := newPair(t)
	p.fenced.Listen(t, ":"+strconv.Itoa(int(AgentReplyPorts[0])))
	return p
}

// newPair is newFencedPair with no listener on the agent's port: the fenced namespace listens on
// 9000 and 9001 only.
func newPair(t *testing.T) fencedPair {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("not root: this test makes network namespaces and writes netfilter tables in them")
	}
	for _, tool := range []string{"iptables-legacy-save", "ip6tables-legacy-save"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s: %v (install iptables: it reads the tables back)", tool, err)
		}
	}
	fenced, peer := newNetns(t), newNetns(t)
	fenced.Sh(t,
		"ip link set lo up",
		"ip link add fence0 type veth peer name peer0 netns "+strconv.Itoa(peer.Tid),
		"ip addr add 10.201.0.1/24 dev fence0",
		"ip addr add fd00:201::1/64 dev fence0 nodad",
		"ip link set fence0 up",
		"ip -6 route add fd00:202::/64 via fe80::2 dev fence0",
		"ip -6 route add fd00:203::/64 nexthop via fe80::2 dev fence0 nexthop via fe80::4 dev fence0")
	peer.Sh(t,
		"ip link set lo up",
		"ip addr add 10.201.0.2/24 dev peer0",
		"ip addr add 10.201.0.3/24 dev peer0",
		"ip addr add fd00:201::2/64 dev peer0 nodad",
		"ip addr add fd00:201::3/64 dev peer0 nodad",
		// No address of the link's own making: a gateway's solicitations come from fe80::2.
		"ip link set peer0 addrgenmode none",
		"ip addr add fe80::2/64 dev peer0 nodad",
		"ip addr add fe80::3/64 dev peer0 nodad",
		"ip addr add fd00:202::2/128 dev lo",
		"ip link set peer0 up")
	peer.Listen(t, ":8443")
	peer.Listen(t, ":8444")
	fenced.Listen(t, ":9000")
	fenced.Listen(t, ":9001")
	return fencedPair{fenced, peer}
}

var (
	allowedAddrs = []string{"10.201.0.2:8443", "[fd00:201::2]:8443", "[fd00:202::2]:8443", "127.0.0.1:9000", "[::1]:9000"}
	deniedAddrs  = []string{"10.201.0.3:8443", "10.201.0.2:8444", "[fd00:201::3]:8443", "[fd00:201::2]:8444"}
	pairAllowed  = []Rule{
		{Dst: netip.MustParsePrefix("10.201.0.2/32"), Proto: TCP, DstPorts: Ports{8443, 8443}},
		{Dst: netip.MustParsePrefix("fd00:201::2/128"), Proto: TCP, DstPorts: Ports{8443, 8443}},
		{Dst: netip.MustParsePrefix("fd00:202::2/128"), Proto: TCP, DstPorts: Ports{8443, 8443}},
	}
	pairReplyTo = []netip.Prefix{netip.MustParsePrefix("10.201.0.2/32"), netip.MustParsePrefix("fd00:201::2/128")}
	saveHead    = []string{
		"*filter",
		":INPUT ACCEPT [0:0]",
		":FORWARD DROP [0:0]",
		":OUTPUT DROP [0:0]",
	}
	// pairICMPv6Save is the ICMPv6 that ip6tables-legacy-save shows for pairAllowed: to the
	// gateways, the solicited-node groups and the allowed destinations.
	pairICMPv6Save = []string{
		"-A OUTPUT -d fe80::2/128 -p ipv6-icmp -j ACCEPT",
		"-A OUTPUT -d fe80::4/128 -p ipv6-icmp -j ACCEPT",
		"-A OUTPUT -d ff02::1:ff00:0/104 -p ipv6-icmp -j ACCEPT",
		"-A OUTPUT -d fd00:201::2/128 -p ipv6-icmp -j ACCEPT",
		"-A OUTPUT -d fd00:202::2/128 -p ipv6-icmp -j ACCEPT",
	}
	// noEcho are a link-local neighbour that is no gateway and the link's all-nodes group.
	noEcho = []string{"fe80::3%fence0", "ff02::1%fence0"}
)

// unfencedConnects checks that the namespaces' network is up: every address connects, and so
// does a listener on the witness address.
func (p fencedPair) unfencedConnects(t *testing.T) {
	t.Helper()
	for _, addr := range append(slices.Clone(allowedAddrs), deniedAddrs...) {
		if err := p.fenced.connects(addr, 5*time.Second); err != nil {
			t.Fatalf("before the fence, %s: %v (the namespaces' network is not up)", addr, err)
		}
	}
	if err := p.fenced.witness(t, 5*time.Second); !errors.Is(err, ErrWitnessArrived) {
		t.Fatalf("before the fence, the witness: %v; want it to arrive", err)
	}
	for _, addr := range noEcho {
		if !p.fenced.echoes(t, addr, 5*time.Second) {
			t.Fatalf("before the fence, no answer to an echo to %s", addr)
		}
	}
}

// apply writes the fence of pairAllowed, with the reply rules of replyPorts, in the fenced
// namespace as the verb does (withGateways reads its routes), then makes the peer forget the
// fenced namespace's link-layer addresses: every reply through the fence then waits for a
// neighbour discovery answered through it.
func (p fencedPair) apply(t *testing.T, replyPorts []uint16) (fenced []Fenced, err error) {
	t.Helper()
	p.fenced.Do(func() {
		var allows []Rule
		if allows, err = withGateways(pairAllowed); err == nil {
			fenced, err = Apply(OutputRules(pairReplyTo, replyPorts, allows))
		}
	})
	p.peer.Sh(t, "ip -6 neigh flush dev peer0")
	return fenced, err
}

// witness runs ProbeWitness in the namespace.
func (ns *netns) witness(t *testing.T, timeout time.Duration) (err error) {
	t.Helper()
	ns.Do(func() { err = ProbeWitness(timeout) })
	return err
}

// skipWithoutFilterTable skips when the kernel cannot load ip_tables' filter table.
func skipWithoutFilterTable(t *testing.T, err error) {
	t.Helper()
	if errors.Is(err, syscall.ENOPROTOOPT) || errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.EAFNOSUPPORT) {
		t.Skipf("this kernel cannot load ip_tables' filter table: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestApplyFencesANetworkNamespace writes the fence into a fresh network namespace of the real
// kernel, joined by a veth pair to a peer namespace: iptables-legacy-save and
// ip6tables-legacy-save must show exactly the rules, allowed destinations must connect, others
// must be refused at once (a TCP reset from the table, not a timeout), and so must a datagram to
// the witness (port unreachable), and only
// the agent's ports may answer connections from outside, on IPv4 and IPv6.
func TestApplyFencesANetworkNamespace(t *testing.T) {
	p := newFencedPair(t)
	p.unfencedConnects(t)
	var gateways []netip.Addr
	var err error
	p.fenced.Do(func() { gateways, err = ipv6Gateways() })
	if want := []netip.Addr{netip.MustParseAddr("fe80::2"), netip.MustParseAddr("fe80::4")}; err != nil || !slices.Equal(gateways, want) {
		t.Fatalf("ipv6Gateways() = %v, %v; want %v, of the plain route and the multipath one", gateways, err, want)
	}

	fenced, err := p.apply(t, AgentReplyPorts)
	skipWithoutFilterTable(t, err)
	if want := []Fenced{{"IPv4", true}, {"IPv6", true}}; !slices.Equal(fenced, want) {
		t.Errorf("Apply fenced %v, want %v: both families refusing tcp", fenced, want)
	}

	p.fenced.checkSave(t, "iptables-legacy-save", slices.Concat(saveHead, []string{
		"-A OUTPUT -d 127.0.75.44/32 -p udp -j REJECT --reject-with icmp-port-unreachable",
		"-A OUTPUT -o lo -j ACCEPT",
		"-A OUTPUT -d 10.201.0.2/32 -p tcp -m tcp --sport 7543 -j ACCEPT",
		"-A OUTPUT -d 10.201.0.2/32 -p tcp -m tcp --sport 7544 -j ACCEPT",
		"-A OUTPUT -d 10.201.0.2/32 -p tcp -m tcp --dport 8443 -j ACCEPT",
		"-A OUTPUT -p tcp -j REJECT --reject-with tcp-reset",
		"COMMIT"}))
	p.fenced.checkSave(t, "ip6tables-legacy-save", slices.Concat(saveHead, []string{
		"-A OUTPUT -o lo -j ACCEPT",
		"-A OUTPUT -d fd00:201::2/128 -p tcp -m tcp --sport 7543 -j ACCEPT",
		"-A OUTPUT -d fd00:201::2/128 -p tcp -m tcp --sport 7544 -j ACCEPT",
		"-A OUTPUT -d fd00:201::2/128 -p tcp -m tcp --dport 8443 -j ACCEPT",
		"-A OUTPUT -d fd00:202::2/128 -p tcp -m tcp --dport 8443 -j ACCEPT"},
		pairICMPv6Save, []string{
			"-A OUTPUT -p tcp -j REJECT --reject-with tcp-reset",
			"COMMIT"}))

	for _, addr := range allowedAddrs {
		if err := p.fenced.connects(addr, 5*time.Second); err != nil {
			t.Errorf("allowed %s: %v", addr, err)
		}
	}
	for _, addr := range noEcho {
		if p.fenced.echoes(t, addr, time.Second) {
			t.Errorf("an echo to %s was answered through the fence", addr)
		}
	}
	// Refused, not timed out: the connect's own bound is far above the reset's way back.
	for _, addr := range deniedAddrs {
		start := time.Now()
		err := p.fenced.connects(addr, 5*time.Second)
		if took := time.Since(start); !errors.Is(err, syscall.ECONNREFUSED) || took > time.Second {
			t.Errorf("denied %s: %v after %s; want refused at once", addr, err, took.Round(time.Millisecond))
		}
	}
	start := time.Now()
	if err := p.fenced.witness(t, 5*time.Second); err != nil || time.Since(start) > time.Second {
		t.Errorf("the witness: %v after %s; want it stopped at once", err, time.Since(start).Round(time.Millisecond))
	}
	// UDP is dropped, not refused: a connected socket hears nothing.
	p.fenced.Do(func() {
		c, err := net.Dial("udp", "10.201.0.3:8443")
		if err != nil {
			t.Errorf("udp: %v", err)
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(300 * time.Millisecond))
		_, _ = c.Write([]byte("x"))
		var ne net.Error
		if _, err := c.Read(make([]byte, 1)); !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("udp to a denied address: %v; want no answer", err)
		}
	})
	p.repliesOnlyFromTheAgentsPortsToReplyTo(t)
}

// TestApplyWithoutRejectDrops: a runtime without the REJECT target (gVisor a81fd9dd382e answers
// EINVAL to a table that names it) gets the same rules, dropping what the other refuses. Denied
// connects time out; the witness is stopped all the same.
func TestApplyWithoutRejectDrops(t *testing.T) {
	p := newFencedPair(t)
	p.unfencedConnects(t)
	var refused int
	setReplace = func(f family, fd int, req []byte) error {
		if bytes.Contains(req, []byte("REJECT\x00")) {
			refused++
			return syscall.EINVAL
		}
		return f.setsockopt(fd, req)
	}
	t.Cleanup(func() { setReplace = family.setsockopt })
	fenced, err := p.apply(t, AgentReplyPorts)
	skipWithoutFilterTable(t, err)
	if want := []Fenced{{"IPv4", false}, {"IPv6", false}}; !slices.Equal(fenced, want) || refused != 2 {
		t.Errorf("Apply fenced %v after %d refused tables, want %v after 2", fenced, refused, want)
	}
	p.fenced.checkSave(t, "iptables-legacy-save", slices.Concat(saveHead, []string{
		"-A OUTPUT -d 127.0.75.44/32 -p udp -j DROP",
		"-A OUTPUT -o lo -j ACCEPT",
		"-A OUTPUT -d 10.201.0.2/32 -p tcp -m tcp --sport 7543 -j ACCEPT",
		"-A OUTPUT -d 10.201.0.2/32 -p tcp -m tcp --sport 7544 -j ACCEPT",
		"-A OUTPUT -d 10.201.0.2/32 -p tcp -m tcp --dport 8443 -j ACCEPT",
		"COMMIT"}))
	for _, addr := range allowedAddrs {
		if err := p.fenced.connects(addr, 5*time.Second); err != nil {
			t.Errorf("allowed %s: %v", addr, err)
		}
	}
	var ne net.Error
	for _, addr := range deniedAddrs {
		if err := p.fenced.connects(addr, 300*time.Millisecond); !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("denied %s: %v; want no answer", addr, err)
		}
	}
	if err := p.fenced.witness(t, 300*time.Millisecond); err != nil {
		t.Errorf("the witness: %v; want it stopped", err)
	}
	p.repliesOnlyFromTheAgentsPortsToReplyTo(t)

	// A runtime that refuses the dropping table too fails the verb, closed, as before.
	setReplace = func(family, int, []byte) error { return syscall.EINVAL }
	if _, err = p.apply(t, AgentReplyPorts); err == nil || !strings.Contains(err.Error(), "can't replace iptables table `filter': invalid argument: this runtime refuses the table") {
		t.Errorf("Apply on a runtime that refuses both tables: %v", err)
	}
}

// TestApplyWithoutGatewaysCutsIPv6ThroughThem is why the verb fails when it cannot read the pod's
// gateways (withGateways) rather than write the fence without their rules. A first connect
// through the gateway may pass: the fenced namespace's own solicitation of fe80::2 came from
// fd00:201::1 and taught the gateway its link-layer address. But the gateway confirms it from
// fe80::2, the answer is dropped, the gateway's entry fails, and from then on a connect to a
// destination behind it times out. Written with the gateways read, the same connect passes.
func TestApplyWithoutGatewaysCutsIPv6ThroughThem(t *testing.T) {
	p := newPair(t)
	p.unfencedConnects(t)
	readGateways = func() ([]netip.Addr, error) { return nil, nil }
	t.Cleanup(func() { readGateways = ipv6Gateways })
	_, err := p.apply(t, nil)
	skipWithoutFilterTable(t, err)
	const behind = "[fd00:202::2]:8443"
	p.peer.Sh(t, "sysctl -qw net.ipv6.neigh.peer0.delay_first_probe_time=1") // confirm after 1s, not 5
	_ = p.fenced.connects(behind, 5*time.Second)
	state := ""
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		var out []byte
		p.peer.Do(func() { out, err = exec.Command("ip", "-6", "neigh", "show", "fd00:201::1", "dev", "peer0").Output() })
		if state = strings.TrimSpace(string(out)); err != nil || strings.HasSuffix(state, "FAILED") {
			break
		}
	}
	if !strings.HasSuffix(state, "FAILED") {
		t.Fatalf("the gateway's neighbour entry for fd00:201::1: %q, %v; want FAILED, its solicitations unanswered", state, err)
	}
	var ne net.Error
	if err := p.fenced.connects(behind, 3*time.Second); !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("%s through the gateway fe80::2, with no rule for it: %v; want a timeout", behind, err)
	}
	if err := p.fenced.connects("[fd00:201::2]:8443", 5*time.Second); err != nil {
		t.Errorf("control: fd00:201::2, on the link: %v", err)
	}
	readGateways = ipv6Gateways
	if _, err := p.apply(t, nil); err != nil {
		t.Fatal(err)
	}
	if err := p.fenced.connects(behind, 5*time.Second); err != nil {
		t.Errorf("%s through the gateway fe80::2, its rule read from the routes: %v", behind, err)
	}
}

// repliesOnlyFromTheAgentsPortsToReplyTo: from a --reply-to address, the agent's port answers;
// any other port's replies are denied, and so are the agent's replies to any other address: the
// connects from the peer time out (a reset, if any, goes to the fenced namespace itself).
func (p fencedPair) repliesOnlyFromTheAgentsPortsToReplyTo(t *testing.T) {
	t.Helper()
	agentPort := strconv.Itoa(int(AgentReplyPorts[0]))
	for _, c := range []struct{ host, client, stranger string }{
		{"10.201.0.1", "10.201.0.2", "10.201.0.3"},
		{"fd00:201::1", "fd00:201::2", "fd00:201::3"},
	} {
		if err := p.peer.connectsFrom(c.client, net.JoinHostPort(c.host, agentPort), 5*time.Second); err != nil {
			t.Errorf("the agent's port from %s: %v", c.client, err)
		}
		if err := p.peer.connectsFrom(c.client, net.JoinHostPort(c.host, "9001"), time.Second); err == nil {
			t.Errorf("another port of %s answered %s", c.host, c.client)
		}
		if err := p.peer.connectsFrom(c.stranger, net.JoinHostPort(c.host, agentPort), time.Second); err == nil {
			t.Errorf("the agent's port answered %s, which is not --reply-to", c.stranger)
		}
	}
}

// checkSave runs an iptables-save in the namespace and compares its filter table with want,
// counters aside.
func (ns *netns) checkSave(t *testing.T, save string, want []string) {
	t.Helper()
	if got := ns.save(t, save); !slices.Equal(got, want) {
		t.Errorf("%s in the fenced namespace:\n%s\nwant:\n%s", save, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// save runs an iptables-save in the namespace and returns its filter table's lines, comments
// left out and counters zeroed.
func (ns *netns) save(t *testing.T, save string) []string {
	t.Helper()
	var out []byte
	var err error
	ns.Do(func() { out, err = exec.Command(save, "-t", "filter").Output() })
	if err != nil {
		t.Fatalf("%s: %v", save, err)
	}
	counters := regexp.MustCompile(`\[\d+:\d+\]$`)
	var got []string
	for _, line := range strings.Split(string(out), "\n") {
		if line != "" && !strings.HasPrefix(line, "#") {
			got = append(got, counters.ReplaceAllString(line, "[0:0]"))
		}
	}
	return got
}

// A --reply-to of every address would let the agent's ports answer anywhere: refused. The
// verb runs in a fresh network namespace, so that a verb that accepts it fences only that.
func TestCommandRefusesReplyToEveryAddress(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: a verb that accepted the flag would write netfilter tables")
	}
	ns := newNetns(t)
	for _, every := range []string{"0.0.0.0/0", "::/0"} {
		var out strings.Builder
		var err error
		ns.Do(func() { err = Command([]string{"--reply-to", "10.88.0.0/16", "--reply-to", every}, &out) })
		if err == nil || !strings.Contains(err.Error(), every+" is every address") || strings.Contains(err.Error(), "\n") || out.Len() != 0 {
			t.Errorf("--reply-to %s: %v, printed %q; want a one-line refusal naming it", every, err, out.String())
		}
	}
}

// TestApplyAcceptsRepliesOnlyFromTheGivenPorts: the table of a pod whose agent serves no network
// path (no agent CA) has the reply rule of the readiness probe's port alone (--reply-port 7544).
// Nothing holds 7543 there, so any job process may bind it: from the fenced namespace's own
// address on 7543, a connect to a --reply-to address on a port the table does not allow must be
// refused at once, on IPv4 and IPv6, while the same connect from 7544 gets through (the rule
// that is written is what would have let 7543 out); and once both ports are listened on, a
// --reply-to client gets an answer from 7544 only. Before issue 39, both ports' rules were
// written whatever the agent served.
func TestApplyAcceptsRepliesOnlyFromTheGivenPorts(t *testing.T) {
	p := newPair(t)
	p.unfencedConnects(t)
	_, err := p.apply(t, []uint16{wire.FencePort})
	skipWithoutFilterTable(t, err)
	p.fenced.checkSave(t, "iptables-legacy-save", slices.Concat(saveHead, []string{
		"-A OUTPUT -d 127.0.75.44/32 -p udp -j REJECT --reject-with icmp-port-unreachable",
		"-A OUTPUT -o lo -j ACCEPT",
		"-A OUTPUT -d 10.201.0.2/32 -p tcp -m tcp --sport 7544 -j ACCEPT",
		"-A OUTPUT -d 10.201.0.2/32 -p tcp -m tcp --dport 8443 -j ACCEPT",
		"-A OUTPUT -p tcp -j REJECT --reject-with tcp-reset",
		"COMMIT"}))
	p.fenced.checkSave(t, "ip6tables-legacy-save", slices.Concat(saveHead, []string{
		"-A OUTPUT -o lo -j ACCEPT",
		"-A OUTPUT -d fd00:201::2/128 -p tcp -m tcp --sport 7544 -j ACCEPT",
		"-A OUTPUT -d fd00:201::2/128 -p tcp -m tcp --dport 8443 -j ACCEPT",
		"-A OUTPUT -d fd00:202::2/128 -p tcp -m tcp --dport 8443 -j ACCEPT"},
		pairICMPv6Save, []string{
			"-A OUTPUT -p tcp -j REJECT --reject-with tcp-reset",
			"COMMIT"}))

	pairs := []struct{ host, client string }{{"10.201.0.1", "10.201.0.2"}, {"fd00:201::1", "fd00:201::2"}}
	for _, c := range pairs {
		// The client's 8444: --reply-to, but no --allow; only a reply rule lets a connect out.
		target := net.JoinHostPort(c.client, "8444")
		start := time.Now()
		err := p.fenced.connectsFromPort(c.host, wire.NetworkPort, target, 5*time.Second)
		if took := time.Since(start); !errors.Is(err, syscall.ECONNREFUSED) || took > time.Second {
			t.Errorf("from %s port %d, which no --reply-port names, to %s: %v after %s; want refused at once", c.host, wire.NetworkPort, target, err, took.Round(time.Millisecond))
		}
		if err := p.fenced.connectsFromPort(c.host, wire.FencePort, target, 5*time.Second); err != nil {
			t.Errorf("control: from %s port %d, the --reply-port, to %s: %v; want it let out as a reply", c.host, wire.FencePort, target, err)
		}
	}

	for _, port := range []int{wire.NetworkPort, wire.FencePort} {
		p.fenced.Listen(t, ":"+strconv.Itoa(port))
	}
	for _, c := range pairs {
		if err := p.peer.connectsFrom(c.client, net.JoinHostPort(c.host, strconv.Itoa(wire.FencePort)), 5*time.Second); err != nil {
			t.Errorf("the readiness probe's port from %s: %v", c.client, err)
		}
		if err := p.peer.connectsFrom(c.client, net.JoinHostPort(c.host, strconv.Itoa(wire.NetworkPort)), time.Second); err == nil {
			t.Errorf("port %d of %s answered %s, with no --reply-port %d", wire.NetworkPort, c.host, c.client, wire.NetworkPort)
		}
	}
}

// TestCommandWritesReplyRulesOnlyForItsReplyPorts: the verb writes the reply rules of each
// --reply-port, once, to each --reply-to network, and of no other port: without --reply-port,
// none (it fails closed). Each case runs in a fresh network namespace.
func TestCommandWritesReplyRulesOnlyForItsReplyPorts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: the verb writes netfilter tables")
	}
	for _, tool := range []string{"iptables-legacy-save", "ip6tables-legacy-save"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s: %v (install iptables: it reads the tables back)", tool, err)
		}
	}
	replyTo := []string{"--reply-to", "10.88.0.0/16", "--reply-to", "fd00:88::/64"}
	for _, tc := range []struct {
		ports      []string
		want4      []string
		want6      []string
		wantPrint  []string
		wantAbsent []string
	}{
		{nil, nil, nil, nil, []string{"replies"}},
		{[]string{"7544"},
			[]string{"-A OUTPUT -d 10.88.0.0/16 -p tcp -m tcp --sport 7544 -j ACCEPT"},
			[]string{"-A OUTPUT -d fd00:88::/64 -p tcp -m tcp --sport 7544 -j ACCEPT"},
			[]string{"tcp replies from port 7544 to 10.88.0.0/16, tcp replies from port 7544 to fd00:88::/64"},
			[]string{"port 7543"}},
		{[]string{"7543", "7544", "7543"},
			[]string{"-A OUTPUT -d 10.88.0.0/16 -p tcp -m tcp --sport 7543 -j ACCEPT", "-A OUTPUT -d 10.88.0.0/16 -p tcp -m tcp --sport 7544 -j ACCEPT"},
			[]string{"-A OUTPUT -d fd00:88::/64 -p tcp -m tcp --sport 7543 -j ACCEPT", "-A OUTPUT -d fd00:88::/64 -p tcp -m tcp --sport 7544 -j ACCEPT"},
			[]string{"tcp replies from port 7543 to 10.88.0.0/16, tcp replies from port 7543 to fd00:88::/64, tcp replies from port 7544 to 10.88.0.0/16"},
			nil},
	} {
		args := slices.Clone(replyTo)
		for _, port := range tc.ports {
			args = append(args, "--reply-port", port)
		}
		ns := newNetns(t)
		ns.Sh(t, "ip link set lo up")
		var out strings.Builder
		var err error
		ns.Do(func() { err = Command(args, &out) })
		skipWithoutFilterTable(t, err)
		for _, want := range tc.wantPrint {
			if !strings.Contains(out.String(), want) {
				t.Errorf("--reply-port %v: printed %q, want %q in it", tc.ports, out.String(), want)
			}
		}
		for _, absent := range tc.wantAbsent {
			if strings.Contains(out.String(), absent) {
				t.Errorf("--reply-port %v: printed %q, with %q", tc.ports, out.String(), absent)
			}
		}
		for save, want := range map[string][]string{"iptables-legacy-save": tc.want4, "ip6tables-legacy-save": tc.want6} {
			got := slices.DeleteFunc(ns.save(t, save), func(line string) bool { return !strings.Contains(line, "--sport") })
			if !slices.Equal(got, want) {
				t.Errorf("--reply-port %v: %s's source-port rules:\n%s\nwant:\n%s", tc.ports, save, strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		}
	}
}
