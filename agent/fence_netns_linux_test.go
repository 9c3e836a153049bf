//go:build amd64 || arm64

package agent_test

import (
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent"
	"github.com/sandbox-executor/sandbox-executor/agent/netfence"
	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/netnstest"
)

// inNetns marks the test binary re-executed in a network namespace of its own.
const inNetns = "SANDBOX_EXECUTOR_AGENT_TEST_IN_NETNS"

// TestFenceCheckProvesTheNetstackFence runs the check against the real kernel's netfilter, in a
// network namespace of its own joined by a veth pair to a peer that listens on the canary and the
// allowed address (the test binary runs itself there: the check's connects run on any thread).
// With the netstack fence's table written, it must hold at once although its connects may wait
// 5 s: the table refuses the canary and the witness; without the table, or with one that lets
// the canary through, it must not hold.
func TestFenceCheckProvesTheNetstackFence(t *testing.T) {
	if os.Getenv(inNetns) != "1" {
		if os.Geteuid() != 0 {
			t.Skip("not root: this test makes network namespaces and writes netfilter tables in them")
		}
		cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
		cmd.Env = append(slices.DeleteFunc(os.Environ(), func(e string) bool { return strings.HasPrefix(e, asAgent+"=") }), inNetns+"=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
		out, err := cmd.CombinedOutput()
		if strings.Contains(string(out), "--- SKIP") {
			t.Skipf("in its network namespace:\n%s", out)
		}
		if err != nil || !strings.Contains(string(out), "--- PASS") {
			t.Fatalf("in its network namespace: %v\n%s", err, out)
		}
		t.Logf("in its network namespace:\n%s", out)
		return
	}

	peer := netnstest.New(t)
	netnstest.Sh(t, "ip link set lo up",
		"ip link add fence0 type veth peer name peer0 netns "+strconv.Itoa(peer.Tid),
		"ip addr add 10.202.0.1/24 dev fence0",
		"ip link set fence0 up")
	peer.Sh(t, "ip link set lo up", "ip addr add 10.202.0.2/24 dev peer0", "ip link set peer0 up")
	canary, allowed := "10.202.0.2:8080", "10.202.0.2:8443"
	peer.Listen(t, canary)
	peer.Listen(t, allowed)
	check := func() (wire.FenceReport, time.Duration) {
		env := map[string]string{wire.FenceDenyEnv: canary, wire.FenceAllowEnv: allowed, wire.FenceTimeoutEnv: "5s", wire.FenceNetstackEnv: "true"}
		start := time.Now()
		report := agent.FenceFromEnv(func(k string) string { return env[k] }).Check()
		return report, time.Since(start)
	}
	waitUp := time.Now().Add(10 * time.Second)
	report, _ := check()
	for strings.Contains(report.String(), "allowed") && time.Now().Before(waitUp) { // the veth coming up
		time.Sleep(100 * time.Millisecond)
		report, _ = check()
	}
	if want := "the netstack fence is not in place: a datagram to the witness arrived (127.0.75.44:"; report.Holds || !strings.HasPrefix(report.String(), want) || !strings.Contains(report.String(), "; denied canary "+canary+" is reachable") {
		t.Fatalf("without the table: %s; want %q... and the canary reachable", report, want)
	}

	allow := netfence.Rule{Dst: netip.MustParsePrefix("10.202.0.2/32"), Proto: netfence.TCP, DstPorts: netfence.Ports{First: 8443, Last: 8443}}
	replyTo := []netip.Prefix{netip.MustParsePrefix("10.202.0.2/32")}
	fenced, err := netfence.Apply(netfence.OutputRules(replyTo, netfence.AgentReplyPorts, []netfence.Rule{allow}))
	if err != nil {
		t.Skipf("this kernel cannot take the table: %v", err)
	}
	if !slices.Equal(fenced, []netfence.Fenced{{Family: "IPv4", RefusesTCP: true}, {Family: "IPv6", RefusesTCP: true}}) {
		t.Fatalf("Apply = %v, want both families refusing tcp", fenced)
	}
	for range 3 {
		if report, took := check(); !report.Holds || took > time.Second {
			t.Errorf("with the table: %s in %s; want it to hold at once, not after the 5s timeout", report, took.Round(time.Millisecond))
		} else {
			t.Logf("with the table: %s in %s", report, took.Round(time.Microsecond))
		}
	}

	// A table that lets the canary through holds its witness, but not the fence.
	canaryRule := netfence.Rule{Dst: netip.MustParsePrefix("10.202.0.2/32"), Proto: netfence.TCP, DstPorts: netfence.Ports{First: 8080, Last: 8080}}
	if _, err := netfence.Apply(netfence.OutputRules(replyTo, netfence.AgentReplyPorts, []netfence.Rule{allow, canaryRule})); err != nil {
		t.Fatal(err)
	}
	if report, _ := check(); report.Holds || report.String() != "denied canary "+canary+" is reachable" {
		t.Errorf("with the canary allowed: %s; want it reachable, the witness stopped", report)
	}
}
