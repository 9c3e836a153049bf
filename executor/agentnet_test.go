package executor_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/fakecluster"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// testJob is the job (its binding) the tests' client certificates are for.
const testJob = "job-binding-of-the-test"

// networkTransport serves the network path on the host with the agent of local (its stages
// directory), as the stage daemon does in a pod, and returns the executor's side of it.
func networkTransport(t *testing.T, local *fakecluster.Local) *executor.AgentNetwork {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ca := fakecluster.AgentCA(t)
	identity, err := local.Agent.ServeNetwork(ln, ca.CertificatePEM())
	if err != nil {
		t.Fatal(err)
	}
	config, err := ca.ClientConfig(testJob, identity)
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	return executor.NewAgentNetwork("127.0.0.1", port, config, local)
}

func TestNetworkTransportRunsTheSameStageProtocol(t *testing.T) {
	local := fakecluster.NewLocalWithDaemon(t)
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

// A client certificate of another CA runs nothing over the network: the agent refuses it at
// the handshake, and the stage goes over exec (through the API server) instead.
func TestNetworkTransportRefusesAnotherCA(t *testing.T) {
	local := fakecluster.NewLocalWithDaemon(t)
	a := networkTransport(t, local)
	foreign, err := fakecluster.AgentCA(t).ClientConfig(testJob, "sha256:"+strings.Repeat("0", 64))
	if err != nil {
		t.Fatal(err)
	}
	a.TLS = a.TLS.Clone()
	a.TLS.Certificates = foreign.Certificates
	var out, log testutil.LockedBuffer
	r := newStageRunner(a, &log, "")
	r.StagesDir = local.Agent.StagesDir()
	code, err := r.Run(context.Background(), "build_script", []byte("echo ran\n"), &out, &out)
	if err != nil || code != 0 || len(local.Commands()) == 0 {
		t.Fatalf("Run = %d, %v (exec calls %v); want the stage over exec", code, err, local.Commands())
	}
}

func TestNetworkTransportFallsBackToExecWhenUnreachable(t *testing.T) {
	local := fakecluster.NewLocal(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there any more
	a := executor.NewAgentNetwork("127.0.0.1", 0, nil, local)
	a.Addr = addr
	var out, log testutil.LockedBuffer
	code, err := newStageRunner(a, &log, "").Run(context.Background(), "build_script", []byte("echo over-exec\n"), &out, &out)
	if err != nil || code != 0 || !strings.Contains(out.String(), "over-exec") || len(local.Commands()) == 0 {
		t.Fatalf("Run = %d, %v, %q, exec commands %v: want the stage over exec", code, err, out.String(), local.Commands())
	}
}

// A template that bakes the agent in runs "serve" as the job container's command: it logs its
// identity first, and its stage daemon serves the network path over TLS to the pod's job,
// running stages in a shell started before the stage was asked for.
func TestBakedAgentServesTLSToThePinnedIdentity(t *testing.T) {
	ca := fakecluster.AgentCA(t)
	agent := fakecluster.StartBakedAgent(t, ca)
	sbx := &kube.Sandbox{Namespace: "ns", Pod: "job-pod", Container: "job", PodIP: "127.0.0.1", AgentBaked: true}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := executor.ConnectAgent(ctx, agent, sbx, agent.Port, ca, testJob, nil)
	if err != nil || conn.Probe == nil || conn.Probe.Shell == "" || !conn.Transport.Network() || conn.Fallback != "" {
		t.Fatalf("ConnectAgent = %+v, %v; want the agent probed over the network", conn, err)
	}
	if len(agent.Local.Commands()) != 0 {
		t.Errorf("connecting used exec: %v", agent.Local.Commands())
	}
	daemon, err := conn.Transport.Executor(sbx, agent.Exec(), ca, testJob)
	if err != nil {
		t.Fatal(err)
	}
	daemon.(*executor.AgentNetwork).Addr = fmt.Sprintf("127.0.0.1:%d", agent.Port)
	var stdout, log testutil.LockedBuffer
	r := newStageRunner(daemon, &log, "")
	r.StagesDir = agent.Stages
	code, err := r.Run(ctx, "build_script", []byte("set -e\necho \"ran by $0\"\nfalse\necho not-reached\n"), &stdout, &stdout)
	if err != nil || code != 1 {
		t.Fatalf("Run = %d, %v; want 1 (errexit applies in the sourced script)", code, err)
	}
	if got := stdout.String(); strings.Contains(got, "/script") || !strings.HasPrefix(got, "ran by ") || strings.Contains(got, "not-reached") {
		t.Errorf("output %q: want the stage run by the spare shell (its $0 is the shell, not the script)", got)
	}
	if len(agent.Local.Commands()) != 0 {
		t.Errorf("the stage used exec: %v", agent.Local.Commands())
	}

	// Another job meets this pod (a claim of the same name, say): refused, not run.
	_, err = executor.ConnectAgent(ctx, agent, sbx, agent.Port, ca, "another-job", nil)
	if failure.KindOf(err) != failure.KindSystem || !strings.Contains(err.Error(), "belongs to another job") {
		t.Errorf("another job's ConnectAgent: %v; want a system failure saying the pod is another job's", err)
	}
}

// When the runner has no agent CA, or the pod serves no network path, or cannot be reached,
// the agent is probed over exec and the stages will go over exec, with the reason.
func TestConnectAgentFallsBackToExec(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ca := fakecluster.AgentCA(t)
	agent := fakecluster.StartBakedAgent(t, ca)
	unreachable := &kube.Sandbox{Namespace: "ns", Pod: "job-pod", Container: "job", PodIP: "127.0.0.9", AgentBaked: true}
	conn, err := executor.ConnectAgent(ctx, agent, unreachable, agent.Port, ca, testJob, nil)
	if err != nil || conn.Probe == nil || conn.Transport.Network() || !strings.Contains(conn.Fallback, "cannot reach") || len(agent.Local.Commands()) == 0 {
		t.Fatalf("unreachable pod: ConnectAgent = %+v, %v (exec calls %v); want the probe over exec and the reason", conn, err, agent.Local.Commands())
	}
	noCA := fakecluster.StartBakedAgent(t, nil)
	conn, err = executor.ConnectAgent(ctx, noCA, &kube.Sandbox{Pod: "job-pod", PodIP: "127.0.0.1", AgentBaked: true}, noCA.Port, ca, testJob, nil)
	if err != nil || conn.Transport.Network() || !strings.Contains(conn.Fallback, wire.ClientCAEnv) {
		t.Fatalf("a pod without the agent CA: ConnectAgent = %+v, %v; want exec and the reason naming %s", conn, err, wire.ClientCAEnv)
	}
	conn, err = executor.ConnectAgent(ctx, agent, &kube.Sandbox{Pod: "job-pod", PodIP: "127.0.0.1", AgentBaked: true}, agent.Port, nil, testJob, nil)
	if err != nil || conn.Transport.Network() || conn.Fallback != "" {
		t.Fatalf("a runner without an agent CA: ConnectAgent = %+v, %v; want exec, silently", conn, err)
	}
}

// The stage server knows the pod's address and identity line before the pod is verified:
// prepare makes the TLS handshake meanwhile, and the probe goes on that connection once the
// verified pod shows the same address and identity. A connection made ahead to anything else is
// dropped without a byte sent, and one never used binds the pod to no job.
func TestConnectionMadeAhead(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ca := fakecluster.AgentCA(t)
	agent := fakecluster.StartBakedAgent(t, ca)
	identity := agent.Identity(t)
	sbx := &kube.Sandbox{Namespace: "ns", Pod: "job-pod", Container: "job", PodIP: "127.0.0.1", AgentBaked: true}

	// Made ahead for another job, its handshake done, and dropped: nothing was sent, so the pod
	// is nobody's yet (the job below gets it).
	unused := executor.DialAhead(ctx, "127.0.0.1", agent.Port, ca, "another-job", identity)
	if !unused.Connected() {
		t.Fatal("the connection made ahead for another job was not made")
	}
	unused.Close()

	// Ahead to another address of the same agent (the pod of the name was replaced meanwhile):
	// connected, but not used.
	other := executor.DialAhead(ctx, "localhost", agent.Port, ca, testJob, identity)
	if !other.Connected() {
		t.Fatal("the connection made ahead to localhost was not made")
	}
	conn, err := executor.ConnectAgent(ctx, agent, sbx, agent.Port, ca, testJob, other)
	if err != nil || !conn.Transport.Network() || conn.Ahead {
		t.Fatalf("ahead to another address: ConnectAgent = %+v, %v; want its own connection", conn, err)
	}
	// Ahead to the verified pod's address and identity: the probe goes on it.
	ahead := executor.DialAhead(ctx, "127.0.0.1", agent.Port, ca, testJob, identity)
	conn, err = executor.ConnectAgent(ctx, agent, sbx, agent.Port, ca, testJob, ahead)
	if err != nil || !conn.Transport.Network() || !conn.Ahead || conn.Probe == nil || conn.Probe.Identity != identity {
		t.Fatalf("ahead to the pod: ConnectAgent = %+v, %v; want the probe on the connection made ahead", conn, err)
	}
	if len(agent.Local.Commands()) != 0 {
		t.Errorf("connecting used exec: %v", agent.Local.Commands())
	}
	// The pod is this job's now: another job's connection made ahead gets nothing run.
	late := executor.DialAhead(ctx, "127.0.0.1", agent.Port, ca, "another-job", identity)
	if _, err := executor.ConnectAgent(ctx, agent, sbx, agent.Port, ca, "another-job", late); !strings.Contains(fmt.Sprint(err), "belongs to another job") {
		t.Errorf("another job's connection made ahead: %v; want the pod refused as another job's", err)
	}
}

// lyingLog is a pod whose first log line names another key than its agent's.
type lyingLog struct {
	*fakecluster.BakedAgent
	line string
}

func (l lyingLog) FirstLogLine(context.Context, *kube.Sandbox, time.Duration) (string, error) {
	return l.line, nil
}

// When the key the line names is not the agent's, the handshake made ahead fails, and that
// failure is prepare's answer: the agent is not reached over the network (stages go over exec),
// with the reason.
func TestConnectionMadeAheadToTheWrongKey(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ca := fakecluster.AgentCA(t)
	agent := fakecluster.StartBakedAgent(t, ca)
	agent.Identity(t) // serving
	wrong := "sha256:" + strings.Repeat("0", 64)
	sbx := &kube.Sandbox{Namespace: "ns", Pod: "job-pod", Container: "job", PodIP: "127.0.0.1", AgentBaked: true}
	ahead := executor.DialAhead(ctx, "127.0.0.1", agent.Port, ca, testJob, wrong)
	if ahead.Connected() {
		t.Fatal("a handshake pinning another key succeeded")
	}
	conn, err := executor.ConnectAgent(ctx, lyingLog{agent, wire.IdentityLine(wrong)}, sbx, agent.Port, ca, testJob, ahead)
	if err != nil || conn.Transport.Network() || conn.Ahead || !strings.Contains(conn.Fallback, "is not the pod's") || len(agent.Local.Commands()) == 0 {
		t.Fatalf("ConnectAgent = %+v, %v (exec calls %v); want the probe over exec, saying the key is not the pod's", conn, err, agent.Local.Commands())
	}
}

// Prepare asks the agent about a baked runner helper over the pod network when the job's stages
// go there (no exec, no process started in the sandbox for it); only the copy, when nothing
// matching is baked, goes over exec.
func TestTheBakedHelperIsCheckedOverThePodNetwork(t *testing.T) {
	local := fakecluster.NewLocalWithDaemon(t)
	path, data := writeHelper(t, 1<<20)
	copier := &shellExec{binDir: filepath.Join(t.TempDir(), "bin")}
	var log bytes.Buffer
	sbx := &kube.Sandbox{Namespace: "ns", Pod: "pod-1", Container: "job"}
	if err := executor.InstallHelper(context.Background(), networkTransport(t, local), copier, sbx, path, needsHelper, fakecluster.JobLog(&log)); err != nil {
		t.Fatal(err)
	}
	if len(local.Commands()) != 0 || copier.calls != 1 {
		t.Errorf("exec calls: %v to the agent, %d copies; want the check over the network and one copy over exec", local.Commands(), copier.calls)
	}
	if got, err := os.ReadFile(filepath.Join(copier.binDir, executor.HelperName)); err != nil || !bytes.Equal(got, data) {
		t.Errorf("copied helper: %d bytes, %v; want the %d bytes (none is baked on this host)", len(got), err, len(data))
	}
	if !strings.Contains(log.String(), "Copied the runner helper") {
		t.Errorf("job log: %q", log.String())
	}
}
