package executor_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/kube"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/tests/executortest"
	"github.com/sandbox-executor/sandbox-executor/tests/testutil"
)

const testToken = "0123456789abcdef0123456789abcdef-test-token"

// networkTransport serves the network path on the host with the agent of local (its stages
// directory), as the stage daemon does in a pod.
func networkTransport(t *testing.T, local *executortest.Local) *executor.AgentNetwork {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go local.Agent.ServeNetwork(ln, testToken)
	a := executor.NewAgentNetwork("127.0.0.1", testToken, local)
	a.Addr = ln.Addr().String()
	return a
}

func TestNetworkTransportRunsTheSameStageProtocol(t *testing.T) {
	local := executortest.NewLocalWithDaemon(t)
	script, want := numberedLines(3000)
	var stdout, stderr, log testutil.LockedBuffer
	r := newStageRunner(networkTransport(t, local), &log, "")
	r.StagesDir = local.Agent.StagesDir() // the agent serves from the host here, not a pod
	code, err := r.Run(context.Background(), "build_script", []byte(script+"exit 9\n"), &stdout, &stderr)
	if err != nil || code != 9 {
		t.Fatalf("Run = %d, %v; want 9", code, err)
	}
	if stdout.String() != want {
		t.Fatalf("output: got %d bytes, want %d", len(stdout.String()), len(want))
	}
	if len(local.Commands()) != 0 {
		t.Errorf("the stage went over exec: %v", local.Commands())
	}
}

func TestNetworkTransportRejectsWrongToken(t *testing.T) {
	local := executortest.NewLocalWithDaemon(t)
	a := networkTransport(t, local)
	a.Token = "wrong-token-wrong-token-wrong-token"
	var out, log testutil.LockedBuffer
	r := newStageRunner(a, &log, "")
	r.Reconnects = 0
	_, err := r.Run(context.Background(), "build_script", []byte("echo must-not-run\n"), &out, &out)
	if err == nil || !strings.Contains(err.Error(), "unauthorized") || strings.Contains(out.String(), "must-not-run") {
		t.Fatalf("err = %v, output %q: want the request refused and nothing run", err, out.String())
	}
}

func TestNetworkTransportFallsBackToExecWhenUnreachable(t *testing.T) {
	local := executortest.NewLocal(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there any more
	a := executor.NewAgentNetwork("127.0.0.1", testToken, local)
	a.Addr = addr
	var out, log testutil.LockedBuffer
	code, err := newStageRunner(a, &log, "").Run(context.Background(), "build_script", []byte("echo over-exec\n"), &out, &out)
	if err != nil || code != 0 || !strings.Contains(out.String(), "over-exec") || len(local.Commands()) == 0 {
		t.Fatalf("Run = %d, %v, %q, exec commands %v: want the stage over exec", code, err, out.String(), local.Commands())
	}
}

// A template that bakes the agent in runs "serve" as the job container's command: the stage
// daemon refuses the network until the executor writes the job's token to its stdin, then
// runs stages in a shell started before the stage was asked for.
func TestBakedAgentTakesTheTokenOnStdin(t *testing.T) {
	port, stdin, stages := startBakedAgent(t)

	sbx := &kube.Sandbox{Namespace: "ns", Pod: "job-pod", Container: "job", PodIP: "127.0.0.1"}
	daemon := executor.NewAgentNetwork("127.0.0.1", testToken, nil)
	daemon.Addr = fmt.Sprintf("127.0.0.1:%d", port)
	waitRefusing(t, daemon)
	if _, err := io.WriteString(stdin, "short-line-ignored\n"+testToken+"\n"); err != nil {
		t.Fatal(err)
	}
	transport, probe, err := executor.ChooseTransport(context.Background(), sbx, port, testToken)
	if err != nil || probe.Shell == "" || transport.AgentToken != testToken {
		t.Fatalf("probe after the token: %+v, %v, transport %v", probe, err, transport)
	}

	var stdout, log testutil.LockedBuffer
	r := newStageRunner(daemon, &log, "")
	r.StagesDir = stages
	code, err := r.Run(context.Background(), "build_script", []byte("set -e\necho \"ran by $0\"\nfalse\necho not-reached\n"), &stdout, &stdout)
	if err != nil || code != 1 {
		t.Fatalf("Run = %d, %v; want 1 (errexit applies in the sourced script)", code, err)
	}
	if got := stdout.String(); strings.Contains(got, "/script") || !strings.HasPrefix(got, "ran by ") || strings.Contains(got, "not-reached") {
		t.Errorf("output %q: want the stage run by the spare shell (its $0 is the shell, not the script)", got)
	}
}

// waitRefusing waits until the agent listens and refuses requests: it has no token yet.
func waitRefusing(t *testing.T, daemon *executor.AgentNetwork) {
	t.Helper()
	var refused *executor.RefusedError
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		err := daemon.Exec(context.Background(), kube.ExecRequest{Command: []string{wire.BinaryPath, "probe"}, Stdout: io.Discard, Stderr: io.Discard})
		if errors.As(err, &refused) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("before the token: %v, want the request refused", err)
		}
	}
}

// slowAttach writes to the baked agent's stdin as pods/attach would, then holds the stream open
// until it is cancelled, as a stream torn down through the kubelet does; or fails at once.
type slowAttach struct {
	stdin io.Writer
	fail  error
}

func (a *slowAttach) Attach(ctx context.Context, req kube.ExecRequest) error {
	if a.fail != nil {
		return a.fail
	}
	if _, err := io.Copy(a.stdin, req.Stdin); err != nil {
		return err
	}
	<-ctx.Done()
	return ctx.Err()
}

// The token handover ends when the agent answers over the network, not when the attach stream
// is torn down; an attach that fails ends prepare with an error that names it.
func TestConnectAgentHandsTheTokenOverAttach(t *testing.T) {
	port, stdin, _ := startBakedAgent(t)

	daemon := executor.NewAgentNetwork("127.0.0.1", testToken, nil)
	daemon.Addr = fmt.Sprintf("127.0.0.1:%d", port)
	waitRefusing(t, daemon)
	sbx := &kube.Sandbox{Namespace: "ns", Pod: "job-pod", Container: "job", PodIP: "127.0.0.1", AgentBaked: true}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	transport, probe, err := executor.ConnectAgent(ctx, executortest.NewLocal(t), &slowAttach{stdin: stdin}, sbx, port, testToken)
	if err != nil || probe.Shell == "" || transport.AgentToken != testToken {
		t.Fatalf("ConnectAgent = %+v, %v (transport %v); want the agent probed over the network", probe, err, transport)
	}

	failing := &slowAttach{fail: errors.New("unable to upgrade connection: container not found")}
	_, _, err = executor.ConnectAgent(ctx, executortest.NewLocal(t), failing, &kube.Sandbox{Namespace: "ns", Pod: "other-pod", Container: "job", PodIP: "127.0.0.1", AgentBaked: true}, port, "another-token-another-token-another-token")
	if failure.KindOf(err) != failure.KindSystem || !strings.Contains(err.Error(), "pods/attach") || !strings.Contains(err.Error(), "container not found") {
		t.Fatalf("err = %v, want a system failure naming the attach and its cause", err)
	}

	// A pod the runner cannot reach: the agent is probed over exec, whatever the attach does,
	// and the stages will go over exec (no token kept).
	unreachable := &kube.Sandbox{Namespace: "ns", Pod: "job-pod", Container: "job", PodIP: "127.0.0.9", AgentBaked: true}
	overExec := executortest.NewLocal(t)
	transport, probe, err = executor.ConnectAgent(ctx, overExec, &slowAttach{stdin: io.Discard}, unreachable, port, testToken)
	if err != nil || probe == nil || transport.Network() || len(overExec.Commands()) == 0 {
		t.Fatalf("ConnectAgent = %+v, %v (transport %v, exec calls %v); want the probe over exec", probe, err, transport, overExec.Commands())
	}
}

// startBakedAgent runs the agent's "serve" (the baked-in agent's command) on the host, as a
// job container would, and returns its port, its stdin and its stages directory.
func startBakedAgent(t *testing.T) (int, io.Writer, string) {
	t.Helper()
	stages := filepath.Join(t.TempDir(), "stages")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	serve := exec.Command(os.Args[0], "serve", "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--stages", stages)
	serve.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := serve.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-serve.Process.Pid, syscall.SIGKILL) // serve and its daemon
		_ = serve.Wait()
	})
	return port, stdin, stages
}
