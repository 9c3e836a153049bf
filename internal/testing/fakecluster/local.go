// Package fakecluster provides test doubles for the executor: a fake cluster on the client-go and
// agent-sandbox fake clientsets, and a RemoteExecutor that runs the
// real stage agent on the host in place of a pod, with faults (dropped streams) on demand.
package fakecluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sandbox-executor/sandbox-executor/agent"
	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// AgentEnv marks a test binary re-executed as the agent's stage supervisor.
const AgentEnv = "SANDBOX_EXECUTOR_TEST_AS_AGENT"

// Main must be called from TestMain of packages that use Local: the agent starts stage
// supervisors by re-executing its own binary, which in a test is the test binary. The tests
// themselves run as VerifyNoLeaks runs them.
func Main(m goleak.TestingM) {
	if os.Getenv(AgentEnv) == "1" {
		os.Exit(agent.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Setenv(AgentEnv, "1")
	VerifyNoLeaks(m)
}

// VerifyNoLeaks runs the tests and fails the run when they leave goroutines behind, other than
// klog's flush daemon, which client-go's init starts for the life of the process.
func VerifyNoLeaks(m goleak.TestingM) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"))
}

// Local runs agent commands in this process against stage directories in a temporary
// directory, as if it were the pod. It records every command it ran.
type Local struct {
	// CutAfter, when > 0, drops the stream of each start command after that many bytes of
	// output, for the first Cuts calls.
	CutAfter int
	Cuts     int
	// Probe is returned for the install command.
	Probe wire.Probe
	// Agent runs the commands, with its stage directories in the test's temporary directory.
	Agent *agent.Agent
	// BakedDir stands for the pod's wire.BakedDir (what the init container copied from the
	// agent image) in the commands' arguments, if set.
	BakedDir string

	running  sync.WaitGroup
	mu       sync.Mutex
	commands [][]string
	stdins   []string
}

// NewLocal points the agent at a temporary stages directory for the duration of the test.
func NewLocal(t testing.TB) *Local {
	stages := filepath.Join(t.TempDir(), "stages")
	if err := os.MkdirAll(stages, 0o700); err != nil {
		t.Fatal(err)
	}
	l := &Local{Probe: wire.Probe{Shell: "/bin/sh", KernelRelease: "4.19.0-gvisor"}, Agent: agent.New(agent.Options{StagesDir: stages})}
	// Agent commands left running by a cancelled Exec finish before the test's temporary
	// directory is removed (cleanups run last-in first-out).
	t.Cleanup(func() {
		done := make(chan struct{})
		go func() { l.running.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("fakecluster: an agent command was still running 10s after the test")
		}
	})
	return l
}

// NewLocalWithDaemon is NewLocal with the job's stage daemon running, as prepare leaves a pod.
func NewLocalWithDaemon(t testing.TB) *Local {
	l := NewLocal(t)
	var out, errOut strings.Builder
	if code := l.Agent.Run([]string{"init"}, strings.NewReader(""), &out, &errOut); code != 0 {
		t.Fatalf("agent init: %s", errOut.String())
	}
	pidFile := filepath.Join(filepath.Dir(l.Agent.StagesDir()), "daemon.pid")
	t.Cleanup(func() {
		data, err := os.ReadFile(pidFile)
		if err != nil {
			t.Errorf("the stage daemon left no pid file: %v", err)
			return
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
		if pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return l
}

// ErrStreamCut is the error a cut stream reports.
var ErrStreamCut = errors.New("simulated: connection reset by peer")

// Exec implements kube.RemoteExecutor.
func (l *Local) Exec(ctx context.Context, req kube.ExecRequest) error {
	var stdin []byte
	if req.Stdin != nil {
		stdin, _ = io.ReadAll(req.Stdin)
	}
	l.mu.Lock()
	l.commands = append(l.commands, req.Command)
	l.stdins = append(l.stdins, string(stdin))
	cut := 0
	if len(req.Command) > 1 && req.Command[1] == "start" && l.Cuts > 0 {
		l.Cuts--
		cut = l.CutAfter
	}
	l.mu.Unlock()

	if req.Command[0] == "/bin/sh" { // the install command
		fmt.Fprintf(req.Stdout, `{"shell":%q,"kernel_release":%q,"uid":0}`+"\n", l.Probe.Shell, l.Probe.KernelRelease)
		return nil
	}
	if req.Command[0] != wire.BinaryPath {
		return fmt.Errorf("fakecluster: unexpected command %q", req.Command)
	}
	args := make([]string, 0, len(req.Command)-1)
	for _, a := range req.Command[1:] {
		// The pod's paths, in this test's temporary directories.
		switch {
		case strings.HasPrefix(a, wire.BaseDir+"/"):
			a = filepath.Dir(l.Agent.StagesDir()) + strings.TrimPrefix(a, wire.BaseDir)
		case l.BakedDir != "" && strings.HasPrefix(a, wire.BakedDir+"/"):
			a = l.BakedDir + strings.TrimPrefix(a, wire.BakedDir)
		}
		args = append(args, a)
	}
	// Like a real stream, nothing reaches the caller's writers once Exec has returned.
	stdoutGate, stderrGate := &gate{w: req.Stdout}, &gate{w: req.Stderr}
	defer stdoutGate.close()
	defer stderrGate.close()
	var stdout io.Writer = stdoutGate
	if cut > 0 {
		stdout = &cutWriter{w: stdoutGate, left: cut}
	}
	done := make(chan int, 1)
	l.running.Add(1)
	go func() {
		defer l.running.Done()
		done <- l.Agent.Run(args, strings.NewReader(string(stdin)), stdout, stderrGate)
	}()
	select {
	case code := <-done:
		if cw, ok := stdout.(*cutWriter); ok && cw.cut {
			return ErrStreamCut
		}
		if code != 0 {
			return &kube.ExitError{Code: code}
		}
		return nil
	case <-ctx.Done():
		// Like a real exec: the stream goes away, the remote process (and the stage) go on.
		return ctx.Err()
	}
}

// Commands returns the commands run so far.
func (l *Local) Commands() [][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([][]string(nil), l.commands...)
}

// Stdins returns what each command received on stdin.
func (l *Local) Stdins() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.stdins...)
}

// cutWriter passes left bytes through, then fails like a dropped connection.
type cutWriter struct {
	w    io.Writer
	left int
	cut  bool
}

func (c *cutWriter) Write(p []byte) (int, error) {
	if c.left <= 0 {
		c.cut = true
		return 0, ErrStreamCut
	}
	n := min(len(p), c.left)
	n, err := c.w.Write(p[:n])
	c.left -= n
	if err == nil && n < len(p) {
		c.cut = true
		err = ErrStreamCut
	}
	return n, err
}

// gate forwards writes until closed, then fails them like a closed connection.
type gate struct {
	mu     sync.Mutex
	w      io.Writer
	closed bool
}

func (g *gate) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return 0, ErrStreamCut
	}
	return g.w.Write(p)
}

func (g *gate) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}
