package agent_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sandbox-executor/sandbox-executor/agent"
	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/agentca"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/fakecluster"
)

// asAgent marks the test binary re-executed as the agent: start spawns its stage supervisor by
// running its own binary, which in a test is the test binary. A fuzz worker, which go test
// starts from the same binary with the environment set below and -test.fuzzworker first, is
// not the agent.
const asAgent = "SANDBOX_EXECUTOR_AGENT_TEST_AS_AGENT"

func TestMain(m *testing.M) {
	if os.Getenv(asAgent) == "1" && !slices.Contains(os.Args[1:], "-test.fuzzworker") {
		os.Exit(agent.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Setenv(asAgent, "1")
	goleak.VerifyTestMain(m)
}

func newAgent(t *testing.T) *agent.Agent {
	t.Helper()
	stages := filepath.Join(t.TempDir(), "stages")
	if err := os.MkdirAll(stages, 0o700); err != nil {
		t.Fatal(err)
	}
	return agent.New(agent.Options{StagesDir: stages})
}

// run runs one agent command and returns its exit code, stdout and stderr.
func run(a *agent.Agent, stdin string, args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := a.Run(args, strings.NewReader(stdin), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func startArgs(a *agent.Agent, stage, script string, resume bool) []string {
	sum := sha256.Sum256([]byte(script))
	args := wire.StartArgs(filepath.Join(a.StagesDir(), stage), len(script), hex.EncodeToString(sum[:]), 0, resume)
	return args[1:] // without the binary's path
}

// controls splits the agent's stderr into its control lines and its text.
func controls(t testing.TB, stderr string) (started bool, status int, hasStatus bool, text string) {
	t.Helper()
	var rest []string
	for _, line := range strings.Split(strings.TrimSuffix(stderr, "\n"), "\n") {
		ctl, ok := wire.ParseControl(line)
		switch {
		case !ok:
			rest = append(rest, line)
		case ctl.Started:
			started = true
		case !ctl.Heartbeat:
			status, hasStatus = ctl.Status, true
		}
	}
	return started, status, hasStatus, strings.Join(rest, "\n")
}

func TestUsage(t *testing.T) {
	a := newAgent(t)
	if code, _, stderr := run(a, ""); code != 2 || !strings.Contains(stderr, "usage") {
		t.Errorf("no command: exit %d, %q; want 2 and the usage", code, stderr)
	}
	if code, _, stderr := run(a, "", "frobnicate"); code != wire.ExitAgentFailure || !strings.Contains(stderr, `unknown command "frobnicate"`) {
		t.Errorf("unknown command: exit %d, %q", code, stderr)
	}
}

func TestProbeReportsShellAndKernel(t *testing.T) {
	code, stdout, stderr := run(newAgent(t), "", "probe")
	var probe wire.Probe
	if code != 0 || json.Unmarshal([]byte(stdout), &probe) != nil || probe.Shell == "" || probe.KernelRelease == "" {
		t.Fatalf("probe: exit %d, %q, %q", code, stdout, stderr)
	}
}

// prepare asks for the probe and a fresh fence check in one round trip (wire.ProbeArgs); a
// plain probe, as the install's, carries none.
func TestProbeCarriesAFenceCheckWhenAsked(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := ln.Addr().String()
	ln.Close()
	t.Setenv(wire.FenceDenyEnv, closedAddr)
	t.Setenv(wire.FenceAllowEnv, "")
	for _, tc := range []struct {
		args  []string
		fence bool
	}{{wire.ProbeArgs()[1:], true}, {[]string{"probe"}, false}} {
		code, stdout, stderr := run(newAgent(t), "", tc.args...)
		var probe wire.Probe
		if code != 0 || json.Unmarshal([]byte(stdout), &probe) != nil {
			t.Fatalf("%q: exit %d, %q, %q", tc.args, code, stdout, stderr)
		}
		if got := probe.Fence != nil; got != tc.fence {
			t.Errorf("%q: fence report %t, want %t", tc.args, got, tc.fence)
		} else if tc.fence && (!probe.Fence.Configured || !probe.Fence.Holds) {
			t.Errorf("%q: fence %+v, want configured and holding (the denied canary %s refuses)", tc.args, *probe.Fence, closedAddr)
		}
	}
}

// Without a stage daemon, start runs the stage under a supervisor of its own and reports its
// output on stdout and its exit status in a control line, after acknowledging the start.
func TestStartRunsTheStageAndReportsItsStatus(t *testing.T) {
	a := newAgent(t)
	script := "echo out; echo err >&2; exit 7\n"
	code, stdout, stderr := run(a, script, startArgs(a, "build-1", script, false)...)
	started, status, hasStatus, text := controls(t, stderr)
	if code != 0 || !started || !hasStatus || status != 7 || text != "" {
		t.Fatalf("start: exit %d, started %t, status %d (%t), stderr text %q", code, started, status, hasStatus, text)
	}
	if stdout != "out\nerr\n" {
		t.Errorf("output %q: want stdout and stderr of the stage merged, as a job log is", stdout)
	}
	// A re-attach to the finished stage delivers the same, and never runs it again.
	code, stdout, stderr = run(a, "", startArgs(a, "build-1", script, true)...)
	if _, status, _, _ := controls(t, stderr); code != 0 || status != 7 || stdout != "out\nerr\n" {
		t.Errorf("re-attach: exit %d, status %d, output %q", code, status, stdout)
	}
}

func TestStartRefusesWhatItMustNotRun(t *testing.T) {
	a := newAgent(t)
	script := "echo must-not-run\n"
	for name, args := range map[string][]string{
		"truncated": startArgs(a, "s1", script+"and more", false),
		"outside":   {"start", "--dir", filepath.Join(t.TempDir(), "elsewhere"), "--size", strconv.Itoa(len(script)), "--sha256", strings.Repeat("0", 64)},
		"resumed":   startArgs(a, "s2", script, true),
		"checksum":  {"start", "--dir", filepath.Join(a.StagesDir(), "s3"), "--size", strconv.Itoa(len(script)), "--sha256", strings.Repeat("0", 64)},
	} {
		code, stdout, stderr := run(a, script, args...)
		if code != wire.ExitAgentFailure || strings.Contains(stdout, "must-not-run") {
			t.Errorf("%s: exit %d, output %q, stderr %q; want the agent's failure and nothing run", name, code, stdout, stderr)
		}
	}
}

// The network path serves the same commands, over TLS 1.3, to an executor with a client
// certificate of the pod's agent CA, for the job that reached it first; nothing to anyone else.
func TestServeNetworkRequiresTheAgentCAAndOneJob(t *testing.T) {
	a := newAgent(t)
	ln, ca, identity := serveNetwork(t, a)
	request := func(config *tls.Config, args ...string) (int, string, string, error) {
		conn, err := tls.Dial("tcp", ln.Addr().String(), config)
		if err != nil {
			return 0, "", "", err
		}
		defer conn.Close()
		if _, err := io.WriteString(conn, wire.RequestHeader(args, 0)); err != nil {
			return 0, "", "", err
		}
		var stdout, stderr bytes.Buffer
		code, err := wire.ReadFrames(bufio.NewReader(conn), &stdout, &stderr)
		return code, stdout.String(), stderr.String(), err
	}
	jobA := clientConfig(t, ca, "job-a", identity)
	if code, stdout, _, err := request(jobA, "probe"); err != nil || code != 0 || !strings.Contains(stdout, identity) {
		t.Errorf("probe by the pod's job: exit %d, %q, %v; want its probe, naming the agent's identity", code, stdout, err)
	}
	if code, _, stderr, err := request(clientConfig(t, ca, "job-b", identity), "probe"); err != nil || code != wire.ExitRefused || !strings.Contains(stderr, "belongs to another job") {
		t.Errorf("probe by another job: exit %d, %q, %v; want refused", code, stderr, err)
	}
	if code, _, stderr, err := request(jobA, "install", "/tmp/x"); err != nil || code != wire.ExitRefused || !strings.Contains(stderr, "bad arguments") {
		t.Errorf("a command not served over the network: exit %d, %q, %v", code, stderr, err)
	}
	other := fakecluster.AgentCA(t)
	if _, _, _, err := request(clientConfig(t, other, "job-a", identity), "probe"); err == nil {
		t.Error("a client certificate of another CA was served")
	}
	noCert := clientConfig(t, ca, "job-a", identity)
	noCert.Certificates = nil
	if _, _, _, err := request(noCert, "probe"); err == nil {
		t.Error("a client without a certificate was served")
	}
	tls12 := clientConfig(t, ca, "job-a", identity)
	tls12.MaxVersion = tls.VersionTLS12
	if _, _, _, err := request(tls12, "probe"); err == nil {
		t.Error("TLS 1.2 was served")
	}
	var pinErr *agentca.IdentityError
	if _, _, _, err := request(clientConfig(t, ca, "job-a", wire.IdentityOf([]byte("another key"))), "probe"); !errors.As(err, &pinErr) {
		t.Errorf("an agent whose key is not the pinned one: %v; want an IdentityError", err)
	}
	// Plain text, as the network path spoke before TLS: the agent answers nothing and runs nothing.
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, wire.RequestHeader([]string{"probe"}, 0)); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if answer, _ := io.ReadAll(conn); bytes.Contains(answer, []byte("shell")) {
		t.Errorf("a plain-text request was answered: %q", answer)
	}
}

// A recording of an executor's session, replayed byte for byte to the agent, drives nothing:
// TLS 1.3 binds every session to fresh randoms of both sides.
func TestServeNetworkRefusesAReplayedSession(t *testing.T) {
	a := newAgent(t)
	ln, ca, identity := serveNetwork(t, a)
	// The recorded session starts a stage that appends a line to marker: a replay that were
	// served would start it again (its stage directory is removed after the recording).
	marker := filepath.Join(t.TempDir(), "ran")
	script := []byte("echo ran >> " + marker + "\n")
	sum := sha256.Sum256(script)
	stageDir := filepath.Join(a.StagesDir(), "replayed")
	args := wire.StartArgs(stageDir, len(script), hex.EncodeToString(sum[:]), 0, false)[1:]
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	var sent bytes.Buffer
	conn := tls.Client(recordingConn{raw, &sent}, clientConfig(t, ca, "job-a", identity))
	if _, err := io.WriteString(conn, wire.RequestHeader(args, len(script))); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(script); err != nil {
		t.Fatal(err)
	}
	if code, err := wire.ReadFrames(bufio.NewReader(conn), io.Discard, io.Discard); err != nil || code != 0 {
		t.Fatalf("the recorded session: exit %d, %v", code, err)
	}
	conn.Close()
	if ran, _ := os.ReadFile(marker); string(ran) != "ran\n" {
		t.Fatalf("the recorded session's stage wrote %q", ran)
	}
	if err := os.RemoveAll(stageDir); err != nil {
		t.Fatal(err)
	}
	if sent.Len() == 0 || bytes.Contains(sent.Bytes(), []byte("SBX2")) {
		t.Fatalf("the recording (%d bytes) is empty or holds the request in clear", sent.Len())
	}
	replay, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer replay.Close()
	if _, err := replay.Write(sent.Bytes()); err != nil {
		t.Fatal(err)
	}
	_ = replay.SetReadDeadline(time.Now().Add(10 * time.Second))
	// The agent ends the connection when the replayed handshake fails to verify.
	if _, err := io.ReadAll(replay); err != nil {
		t.Fatalf("the agent did not end the replayed session: %v", err)
	}
	if ran, _ := os.ReadFile(marker); string(ran) != "ran\n" {
		t.Errorf("the replayed session ran the stage again: marker %q", ran)
	}
	if _, err := os.Stat(stageDir); err == nil {
		t.Error("the replayed session recreated the stage directory")
	}
	// The agent still serves its job afterwards.
	after, err := tls.Dial("tcp", ln.Addr().String(), clientConfig(t, ca, "job-a", identity))
	if err != nil {
		t.Fatalf("after the replay, the job's own executor: %v", err)
	}
	after.Close()
}

type recordingConn struct {
	net.Conn
	sent *bytes.Buffer
}

func (c recordingConn) Write(p []byte) (int, error) {
	c.sent.Write(p)
	return c.Conn.Write(p)
}

// serveNetwork serves a's network path on a loopback port to a new agent CA's certificates,
// until the test ends, and returns the listener, the CA and the agent's identity.
func serveNetwork(t *testing.T, a *agent.Agent) (net.Listener, *agentca.CA, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ca := fakecluster.AgentCA(t)
	identity, err := a.ServeNetwork(ln, ca.CertificatePEM())
	if err != nil || !wire.ValidIdentity(identity) {
		t.Fatalf("ServeNetwork = %q, %v", identity, err)
	}
	return ln, ca, identity
}

func clientConfig(t *testing.T, ca *agentca.CA, job, identity string) *tls.Config {
	t.Helper()
	config, err := ca.ClientConfig(job, identity)
	if err != nil {
		t.Fatal(err)
	}
	return config
}
