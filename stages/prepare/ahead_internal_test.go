package prepare

import (
	"context"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/fakecluster"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// The sandbox a claim announces gets its TLS handshake started at once, and the probe of the
// verified pod goes on that connection; a line that names no agent starts nothing.
func TestAnnouncedSandboxIsConnectedAhead(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ca := fakecluster.AgentCA(t)
	agent := fakecluster.StartBakedAgent(t, ca)
	line := wire.IdentityLine(agent.Identity(t))
	sbx := &kube.Sandbox{Namespace: "ns", Pod: "job-pod", Container: "job", PodIP: "127.0.0.1", AgentBaked: true}

	quiet := &agentAhead{ctx: ctx, ca: ca, job: "job-binding", port: agent.Port}
	quiet.announced("127.0.0.1", "not an identity line\n")
	if quiet.dial != nil {
		t.Error("a line without an identity started a connection")
	}

	ahead := &agentAhead{ctx: ctx, ca: ca, job: "job-binding", port: agent.Port}
	defer ahead.close()
	ahead.announced("127.0.0.1", line)
	first := ahead.dial
	ahead.announced("127.0.0.1", line)
	if first == nil || ahead.dial != first {
		t.Fatal("the announced sandbox was not connected ahead, once")
	}
	conn, err := executor.ConnectAgent(ctx, agent, sbx, agent.Port, ca, "job-binding", ahead.dial)
	if err != nil || !conn.Ahead || !conn.Transport.Network() {
		t.Fatalf("ConnectAgent = %+v, %v; want the probe on the connection made ahead", conn, err)
	}
}
