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

	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/executor/agent"
	"github.com/sandbox-executor/sandbox-executor/executor/executortest"
	"github.com/sandbox-executor/sandbox-executor/internal/testutil"
)

const testToken = "0123456789abcdef0123456789abcdef-test-token"

func networkTransport(t *testing.T, fallback executor.RemoteExecutor) *executor.AgentNetwork {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go agent.ServeNetwork(ln, testToken)
	a := executor.NewAgentNetwork("127.0.0.1", testToken, fallback)
	a.Addr = ln.Addr().String()
	return a
}

func TestNetworkTransportRunsTheSameStageProtocol(t *testing.T) {
	local := executortest.NewLocalWithDaemon(t)
	script, want := numberedLines(3000)
	var stdout, stderr, log testutil.LockedBuffer
	r := newStageRunner(networkTransport(t, local), &log, "")
	r.StagesDir = agent.StagesDirInUse() // the agent serves from the host here, not a pod
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
	restoreStages := agent.SetStagesDir(stages)
	defer restoreStages()
	defer executor.SetAgentPort(port)()

	sbx := &executor.Sandbox{Namespace: "ns", Pod: "job-pod", Container: "job", PodIP: "127.0.0.1"}
	daemon := executor.NewAgentNetwork("127.0.0.1", testToken, nil)
	daemon.Addr = fmt.Sprintf("127.0.0.1:%d", port)
	var refused *executor.RefusedError
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		err := daemon.Exec(context.Background(), executor.ExecRequest{Command: []string{agent.BinaryPath, "probe"}, Stdout: io.Discard, Stderr: io.Discard})
		if errors.As(err, &refused) {
			break // listening, and refusing: no token yet
		}
		if time.Now().After(deadline) {
			t.Fatalf("before the token: %v, want the request refused", err)
		}
	}
	if _, err := io.WriteString(stdin, "short-line-ignored\n"+testToken+"\n"); err != nil {
		t.Fatal(err)
	}
	probe, err := executor.ProbeOverNetwork(context.Background(), sbx, testToken)
	if err != nil || probe.Shell == "" || sbx.AgentToken != testToken {
		t.Fatalf("probe after the token: %+v, %v, token kept %q", probe, err, sbx.AgentToken)
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
