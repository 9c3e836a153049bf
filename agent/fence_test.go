package agent_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent"
	"github.com/sandbox-executor/sandbox-executor/agent/wire"
)

// accepting is a loopback address that accepts connections (an allowed host, or a canary the
// policy fails to block).
func accepting(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()
	return ln.Addr().String()
}

// refusing is a loopback address where nothing listens: connects are refused at once, as a
// REJECT-ing policy (kube-router, the netstack fence) answers a denied one.
func refusing(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func fence(deny, allow, timeout string) agent.Fence {
	env := map[string]string{wire.FenceDenyEnv: deny, wire.FenceAllowEnv: allow, wire.FenceTimeoutEnv: timeout}
	return agent.FenceFromEnv(func(k string) string { return env[k] })
}

func TestFenceCheck(t *testing.T) {
	open, closed := accepting(t), refusing(t)
	for _, tc := range []struct {
		name, deny, allow string
		want              wire.FenceReport
	}{
		{"holds: the canary refused, the instance accepts", closed, open, wire.FenceReport{Configured: true, Holds: true}},
		{"canary reachable", open + ", " + closed, open, wire.FenceReport{Configured: true, Problems: []string{"denied canary " + open + " is reachable"}}},
		{"instance unreachable", closed, open + "," + closed, wire.FenceReport{Configured: true, Problems: []string{"allowed " + closed + " is not reachable (refused)"}}},
		{"no network at all proves nothing", closed, closed, wire.FenceReport{Configured: true, Problems: []string{"allowed " + closed + " is not reachable (refused)"}}},
		{"not configured", "", "", wire.FenceReport{}},
		{"malformed", "10.99.0.2", open, wire.FenceReport{Configured: true, Problems: []string{wire.FenceDenyEnv + `: "10.99.0.2" is not host:port`}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := fence(tc.deny, tc.allow, "").Check()
			if fmt.Sprint(got) != fmt.Sprint(tc.want) || got.Holds != tc.want.Holds || got.Configured != tc.want.Configured {
				t.Errorf("Check() = %#v\nwant      %#v", got, tc.want)
			}
		})
	}
}

// A policy that drops denied packets gives no answer at all: the connect's timeout counts as
// denied, and bounds the check. (TEST-NET-1 is not routed: a timeout, or at once "unreachable"
// on a host without a default route; both are denied.)
func TestFenceCheckCountsNoAnswerAsDenied(t *testing.T) {
	f := fence("192.0.2.1:80", accepting(t), "100ms")
	start := time.Now()
	report := f.Check()
	if took := time.Since(start); !report.Holds || took > time.Second {
		t.Errorf("Check() = %v in %s; want it to hold within about the 100ms timeout", report, took)
	}
	if bad := fence("", "", "1h").Check(); bad.Holds || !bad.Configured {
		t.Errorf("a timeout out of range: %v, want a fence that does not hold", bad)
	}
}

// SANDBOX_EXECUTOR_FENCE_NETSTACK=true asks the check to prove the netstack fence's table; here,
// on the host, there is none, so the witness's datagram arrives and the fence does not hold,
// whatever the canaries say. (With the table: TestFenceCheckProvesTheNetstackFence.)
func TestFenceCheckRequiresTheNetstackFenceWhenTold(t *testing.T) {
	open, closed := accepting(t), refusing(t)
	for _, tc := range []struct {
		netstack string
		holds    bool
		problem  string
	}{
		{"", true, ""},
		{"false", true, ""},
		{"true", false, "the netstack fence is not in place: a datagram to the witness arrived (127.0.75.44:"},
		{"yes", false, wire.FenceNetstackEnv + `="yes" is neither true nor false`},
	} {
		env := map[string]string{wire.FenceDenyEnv: closed, wire.FenceAllowEnv: open, wire.FenceNetstackEnv: tc.netstack}
		f := agent.FenceFromEnv(func(k string) string { return env[k] })
		if f.Netstack != (tc.netstack == "true") {
			t.Errorf("%s=%q: Netstack %t", wire.FenceNetstackEnv, tc.netstack, f.Netstack)
		}
		report := f.Check()
		if report.Holds != tc.holds || !report.Configured || !strings.HasPrefix(report.String(), tc.problem) || (tc.problem == "") != report.Holds {
			t.Errorf("%s=%q: %+v; want holds %t, %q", wire.FenceNetstackEnv, tc.netstack, report, tc.holds, tc.problem)
		}
	}
	// The witness adds to a check of addresses; alone, it configures none (require_fence wants
	// the addresses, and a template without them is never Ready).
	env := map[string]string{wire.FenceNetstackEnv: "true"}
	if f := agent.FenceFromEnv(func(k string) string { return env[k] }); f.Configured() || f.Check().Configured {
		t.Errorf("the witness alone: configured %t, %v; want nothing configured", f.Configured(), f.Check())
	}
}

// The readiness endpoint answers the kubelet's httpGet probe: 200 while the fence holds, 503
// with the reason otherwise.
func TestServeFenceAnswersReadinessProbes(t *testing.T) {
	open, closed := accepting(t), refusing(t)
	for _, tc := range []struct {
		deny   string
		status int
		body   string
	}{
		{closed, http.StatusOK, "the egress fence holds"},
		{open, http.StatusServiceUnavailable, "denied canary " + open + " is reachable"},
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go agent.ServeFence(ln, fence(tc.deny, open, ""))
		resp, err := http.Get("http://" + ln.Addr().String() + "/fence")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		ln.Close()
		if resp.StatusCode != tc.status || strings.TrimSpace(string(body)) != tc.body {
			t.Errorf("deny %s: %d %q, want %d %q", tc.deny, resp.StatusCode, body, tc.status, tc.body)
		}
	}
}

// A request that never ends its head gets no answer and costs no check.
func TestServeFenceIgnoresHalfRequests(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go agent.ServeFence(ln, fence(refusing(t), accepting(t), ""))
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, "GET / HTTP/1.1\r\n")
	conn.(*net.TCPConn).CloseWrite()
	if line, err := bufio.NewReader(conn).ReadString('\n'); err != io.EOF || line != "" {
		t.Errorf("answered %q, %v; want the connection closed", line, err)
	}
}

// BenchmarkFenceCheck is what a warm pod pays per probe under a rejecting policy: two TCP
// connects on loopback (a denied one refused, an allowed one accepted). In a gVisor pod each
// connect also crosses its network stack, a few times this.
func BenchmarkFenceCheck(b *testing.B) {
	f := fence(refusing(b), accepting(b), "")
	b.ReportAllocs()
	for b.Loop() {
		if !f.Check().Holds {
			b.Fatal("fence does not hold")
		}
	}
}
