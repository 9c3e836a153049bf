//go:build amd64 || arm64

package netfence

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// netns runs functions on one OS thread that has a network namespace of its own, so that
// nothing here reaches the host's namespace: sockets, netfilter calls and commands started from
// that thread all live in the new namespace. The thread is never unlocked, so the runtime
// discards it when the test ends.
type netns struct {
	tid  int
	work chan func()
}

func newNetns(t *testing.T) *netns {
	t.Helper()
	ns := &netns{work: make(chan func())}
	started := make(chan error)
	go func() {
		runtime.LockOSThread()
		if err := syscall.Unshare(syscall.CLONE_NEWNET); err != nil {
			started <- err
			return
		}
		ns.tid = syscall.Gettid()
		started <- nil
		for f := range ns.work {
			f()
		}
	}()
	if err := <-started; err != nil {
		t.Skipf("cannot make a network namespace: %v", err)
	}
	t.Cleanup(func() { close(ns.work) })
	return ns
}

// do runs f on the namespace's thread.
func (ns *netns) do(f func()) {
	done := make(chan struct{})
	ns.work <- func() { defer close(done); f() }
	<-done
}

// sh runs commands in the namespace, failing the test on the first that fails.
func (ns *netns) sh(t *testing.T, commands ...string) {
	t.Helper()
	ns.do(func() {
		for _, c := range commands {
			if out, err := exec.Command("sh", "-c", c).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v: %s", c, err, out)
			}
		}
	})
}

// listen accepts and closes TCP connections on addr in the namespace until the test ends.
func (ns *netns) listen(t *testing.T, addr string) {
	t.Helper()
	var l net.Listener
	var err error
	ns.do(func() { l, err = net.Listen("tcp4", addr) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
}

// connects reports whether a TCP connect from the namespace to addr succeeds.
func (ns *netns) connects(addr string, timeout time.Duration) (err error) {
	ns.do(func() {
		var c net.Conn
		if c, err = net.DialTimeout("tcp4", addr, timeout); err == nil {
			c.Close()
		}
	})
	return err
}

// TestApplyFencesANetworkNamespace writes the fence into a fresh network namespace of the real
// kernel, joined by a veth pair to a peer namespace: iptables-legacy-save must show exactly the
// rules, an allowed destination must connect, others must not, and only the agent's ports may
// answer connections from outside.
func TestApplyFencesANetworkNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: this test makes network namespaces and writes netfilter tables in them")
	}
	save, err := exec.LookPath("iptables-legacy-save")
	if err != nil {
		t.Fatalf("iptables-legacy-save: %v (install iptables: it reads the table back)", err)
	}
	fenced, peer := newNetns(t), newNetns(t)
	fenced.sh(t,
		"ip link set lo up",
		"ip link add fence0 type veth peer name peer0 netns "+strconv.Itoa(peer.tid),
		"ip addr add 10.201.0.1/24 dev fence0",
		"ip link set fence0 up")
	peer.sh(t,
		"ip link set lo up",
		"ip addr add 10.201.0.2/24 dev peer0",
		"ip addr add 10.201.0.3/24 dev peer0",
		"ip link set peer0 up")
	peer.listen(t, "0.0.0.0:8443")
	peer.listen(t, "0.0.0.0:8444")
	fenced.listen(t, "127.0.0.1:9000")
	fenced.listen(t, "0.0.0.0:"+strconv.Itoa(int(AgentReplyPorts[0])))
	fenced.listen(t, "0.0.0.0:9001")

	unfenced := []string{"10.201.0.2:8443", "10.201.0.3:8443", "10.201.0.2:8444", "127.0.0.1:9000"}
	for _, addr := range unfenced {
		if err := fenced.connects(addr, 5*time.Second); err != nil {
			t.Fatalf("before the fence, %s: %v (the namespaces' network is not up)", addr, err)
		}
	}

	allowed := Rule{Dst: netip.MustParsePrefix("10.201.0.2/32"), Proto: TCP, DstPorts: Ports{8443, 8443}}
	fenced.do(func() { err = Apply(OutputRules([]Rule{allowed})) })
	if errors.Is(err, syscall.ENOPROTOOPT) || errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.EAFNOSUPPORT) {
		t.Skipf("this kernel cannot load ip_tables' filter table: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}

	var out []byte
	fenced.do(func() { out, err = exec.Command(save, "-t", "filter").Output() })
	if err != nil {
		t.Fatalf("iptables-legacy-save: %v", err)
	}
	var got []string
	for _, line := range strings.Split(string(out), "\n") {
		if line != "" && !strings.HasPrefix(line, "#") {
			got = append(got, regexp.MustCompile(`\[\d+:\d+\]$`).ReplaceAllString(line, "[0:0]"))
		}
	}
	want := []string{
		"*filter",
		":INPUT ACCEPT [0:0]",
		":FORWARD ACCEPT [0:0]",
		":OUTPUT DROP [0:0]",
		"-A OUTPUT -o lo -j ACCEPT",
		"-A OUTPUT -p tcp -m tcp --sport 7543 -j ACCEPT",
		"-A OUTPUT -p tcp -m tcp --sport 7544 -j ACCEPT",
		"-A OUTPUT -d 10.201.0.2/32 -p tcp -m tcp --dport 8443 -j ACCEPT",
		"COMMIT",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("iptables-legacy-save in the fenced namespace:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	for _, addr := range []string{"10.201.0.2:8443", "127.0.0.1:9000"} {
		if err := fenced.connects(addr, 5*time.Second); err != nil {
			t.Errorf("allowed %s: %v", addr, err)
		}
	}
	for _, addr := range []string{"10.201.0.3:8443", "10.201.0.2:8444"} {
		if err := fenced.connects(addr, time.Second); err == nil {
			t.Errorf("denied %s connected", addr)
		}
	}
	// From outside, the agent's port answers (its replies are allowed); any other port's
	// replies are dropped, so its connect times out.
	if err := peer.connects("10.201.0.1:"+strconv.Itoa(int(AgentReplyPorts[0])), 5*time.Second); err != nil {
		t.Errorf("the agent's port from the peer: %v", err)
	}
	if err := peer.connects("10.201.0.1:9001", time.Second); err == nil {
		t.Error("another port of the fenced namespace answered the peer")
	}
}
