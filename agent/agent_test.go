package agent_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/sandbox-executor/sandbox-executor/agent"
	"github.com/sandbox-executor/sandbox-executor/agent/wire"
)

// asAgent marks the test binary re-executed as the agent: start spawns its stage supervisor by
// running its own binary, which in a test is the test binary.
const asAgent = "SANDBOX_EXECUTOR_AGENT_TEST_AS_AGENT"

func TestMain(m *testing.M) {
	if os.Getenv(asAgent) == "1" {
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
func controls(t *testing.T, stderr string) (started bool, status int, hasStatus bool, text string) {
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

// The network path serves the same commands to whoever presents the token, and nothing else.
func TestServeNetworkChecksTheToken(t *testing.T) {
	a := newAgent(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	token := strings.Repeat("t", wire.MinTokenLen)
	go func() { _ = a.ServeNetwork(ln, token) }()
	request := func(token string, args ...string) (int, string, string) {
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := io.WriteString(conn, wire.RequestHeader(token, args, 0)); err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		code, err := wire.ReadFrames(bufio.NewReader(conn), &stdout, &stderr)
		if err != nil {
			t.Fatal(err)
		}
		return code, stdout.String(), stderr.String()
	}
	if code, stdout, _ := request(token, "probe"); code != 0 || !strings.Contains(stdout, `"shell"`) {
		t.Errorf("probe with the token: exit %d, %q", code, stdout)
	}
	if code, _, stderr := request("wrong", "probe"); code != wire.ExitRefused || !strings.Contains(stderr, "unauthorized") {
		t.Errorf("wrong token: exit %d, %q", code, stderr)
	}
	if code, _, stderr := request(token, "install", "/tmp/x"); code != wire.ExitRefused || !strings.Contains(stderr, "bad arguments") {
		t.Errorf("a command not served over the network: exit %d, %q", code, stderr)
	}
}
