package executor_test

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/executor/agent"
	"github.com/sandbox-executor/sandbox-executor/executor/executortest"
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
	var stdout, stderr, log syncBuffer
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
	var out, log syncBuffer
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
	var out, log syncBuffer
	code, err := newStageRunner(a, &log, "").Run(context.Background(), "build_script", []byte("echo over-exec\n"), &out, &out)
	if err != nil || code != 0 || !strings.Contains(out.String(), "over-exec") || len(local.Commands()) == 0 {
		t.Fatalf("Run = %d, %v, %q, exec commands %v: want the stage over exec", code, err, out.String(), local.Commands())
	}
}
