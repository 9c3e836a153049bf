package executor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/agentca"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// Transport is how the stages of a job reach its pod's agent: over the pod network, straight to
// the agent over mutually authenticated TLS, or over exec through the API server.
type Transport struct {
	// AgentIdentity pins the key of the pod's agent on the network path (wire.IdentityOf, a
	// public value); empty: exec.
	AgentIdentity string
}

// Network reports whether the stages go over the pod network.
func (t Transport) Network() bool { return t.AgentIdentity != "" }

// String names the transport for the job log.
func (t Transport) String() string {
	if t.Network() {
		return "pod network (TLS)"
	}
	return "exec"
}

// Executor is what the stages run agent commands with: the network path, as job with a client
// certificate of ca, with exec behind it; or exec alone (also when this runner has no agent CA
// any more: exec needs none).
func (t Transport) Executor(sbx *kube.Sandbox, exec kube.RemoteExecutor, ca *agentca.CA, job string) (kube.RemoteExecutor, error) {
	if !t.Network() || sbx.PodIP == "" || ca == nil {
		return exec, nil
	}
	config, err := ca.ClientConfig(job, t.AgentIdentity)
	if err != nil {
		return nil, failure.SystemError(err, "the stage's client certificate: %v", err)
	}
	return NewAgentNetwork(sbx.PodIP, wire.NetworkPort, config, exec), nil
}

// AgentCluster is what connecting to a pod's agent asks of the cluster.
type AgentCluster interface {
	Exec() kube.RemoteExecutor
	FirstLogLine(ctx context.Context, sbx *kube.Sandbox, within time.Duration) (string, error)
}

// Connection is a pod's agent, ready for the stages.
type Connection struct {
	Transport Transport
	Probe     *wire.Probe
	// Fallback says why stages go over exec although the runner has an agent CA ("" when they
	// do not, or when they go over the network).
	Fallback string
	// Ahead: the probe went on a connection made ahead (DialAhead).
	Ahead bool
}

// identityWait bounds the wait for a baked-in agent's first log line. The agent writes it before
// its pod can turn Ready (when the template has the fence's readiness probe), so it is there at
// once, but for pods without a probe that have just started.
const identityWait = 5 * time.Second

// probeAnswer bounds one probe over the pod network: the agent answers in milliseconds.
const probeAnswer = 3 * time.Second

// ConnectAgent readies a pod whose template bakes the agent in (sbx.AgentBaked): its stage
// daemon runs already, so nothing is copied and no process is started. With ca, the agent's
// identity is read from the first line of the pod's log (over the API server, not the pod
// network) and the agent is probed over TLS at the pod's address and port: the job's first connection
// binds the pod to it. Without ca, or when the pod serves no network path or cannot be reached,
// the probe goes over exec and so will the stages.
func ConnectAgent(ctx context.Context, cluster AgentCluster, sbx *kube.Sandbox, port int, ca *agentca.CA, job string, ahead *AgentDial) (Connection, error) {
	defer ahead.Close()
	var fallback string
	if ca != nil && sbx.PodIP != "" {
		line, err := cluster.FirstLogLine(ctx, sbx, identityWait)
		switch {
		case errors.Is(err, kube.ErrNoLogLine):
			fallback = fmt.Sprintf("the agent of pod %s logged no identity within %s (is the agent image older than the executor?)", sbx.Pod, identityWait)
		case err != nil:
			return Connection{}, err
		default:
			identity, off, ok := wire.ParseFirstLogLine(line)
			switch {
			case !ok:
				fallback = fmt.Sprintf("the first log line of pod %s is not the agent's identity (is the agent image older than the executor?)", sbx.Pod)
			case identity == "":
				fallback = "pod " + sbx.Pod + ": " + off
			default:
				conn, err := connectNetwork(ctx, sbx, port, ca, job, identity, ahead)
				if err != nil || conn.Fallback == "" {
					return conn, err
				}
				fallback = conn.Fallback
			}
		}
	}
	probe, err := probeOverExec(ctx, cluster.Exec(), sbx)
	return Connection{Probe: probe, Fallback: fallback}, err
}

// ConnectNetwork probes the agent of the pod at its address and port over TLS, pinning identity, with a
// client certificate of ca for job. The network transport and the probe when the agent
// answered; the exec transport, no probe and the reason when the pod cannot be reached over the
// network (policy, CNI) or something else answers there; an error when the agent answered but
// not as it should (another job's pod).
func ConnectNetwork(ctx context.Context, sbx *kube.Sandbox, port int, ca *agentca.CA, job, identity string) (Connection, error) {
	return connectNetwork(ctx, sbx, port, ca, job, identity, nil)
}

// connectNetwork is ConnectNetwork, with the attempt made ahead when it was to this pod's
// address and identity (DialAhead).
func connectNetwork(ctx context.Context, sbx *kube.Sandbox, port int, ca *agentca.CA, job, identity string, ahead *AgentDial) (Connection, error) {
	if sbx.PodIP == "" {
		return Connection{Fallback: "pod " + sbx.Pod + " has no IP address"}, nil
	}
	conn, matched, err := ahead.take(agentAddr(sbx.PodIP, port), identity)
	attempt, cancel := context.WithTimeout(ctx, probeAnswer)
	defer cancel()
	var stdout bytes.Buffer
	probe := kube.ExecRequest{Command: wire.ProbeArgs(), Stdout: &stdout, Stderr: io.Discard}
	daemon := NewAgentNetwork(sbx.PodIP, port, nil, nil)
	if conn != nil {
		err = daemon.send(attempt, conn, probe, nil)
		// Closed before the agent answered anything (an agent closes a connection that sends
		// nothing for 10 s): connect again, as below. An answer, or silence, is the agent's.
		matched = err == nil || answered(err) || stdout.Len() > 0 || attempt.Err() != nil
	}
	if !matched {
		if daemon.TLS, err = ca.ClientConfig(job, identity); err != nil {
			return Connection{}, failure.SystemError(err, "the stage's client certificate: %v", err)
		}
		stdout.Reset()
		err = daemon.exec(attempt, probe, nil)
	}
	if err != nil && ctx.Err() == nil && attempt.Err() != nil {
		// Something at the pod's address took the connection but never answered: not our
		// agent, or a wedged one. Exec still reaches the pod.
		err = fmt.Errorf("%w: %s did not answer within %s", ErrAgentUnreachable, daemon.Addr, probeAnswer)
	}
	switch {
	case err == nil:
		probe, err := parseProbe(sbx, stdout.Bytes())
		if err != nil {
			return Connection{}, err
		}
		return Connection{Transport: Transport{AgentIdentity: identity}, Probe: probe, Ahead: matched && conn != nil}, nil
	case errors.Is(err, ErrAgentUnreachable):
		return Connection{Fallback: "the runner cannot reach the agent of pod " + sbx.Pod + ": " + failure.OneLine(err.Error())}, nil
	case ctx.Err() != nil:
		return Connection{}, ctx.Err()
	default:
		return Connection{}, failure.SystemError(err, "the stage agent in pod %s: %s", sbx.Pod, failure.OneLine(err.Error()))
	}
}

// answered: the agent answered the request (refused it, or ran it to an exit code).
func answered(err error) bool {
	var refused *RefusedError
	var exit *kube.ExitError
	return errors.As(err, &refused) || errors.As(err, &exit)
}

func probeOverExec(ctx context.Context, exec kube.RemoteExecutor, sbx *kube.Sandbox) (*wire.Probe, error) {
	var stdout, stderr bytes.Buffer
	err := exec.Exec(ctx, kube.ExecRequest{Namespace: sbx.Namespace, Pod: sbx.Pod, Container: sbx.Container, Command: wire.ProbeArgs(), Stdout: &stdout, Stderr: &stderr})
	if err != nil {
		return nil, failure.SystemError(err, "probing the stage agent in pod %s/%s: %s", sbx.Namespace, sbx.Pod, failure.OneLine(strings.TrimSpace(stderr.String()+" "+err.Error())))
	}
	return parseProbe(sbx, stdout.Bytes())
}

// agentAddr is the agent's address on the pod network.
func agentAddr(podIP string, port int) string { return net.JoinHostPort(podIP, strconv.Itoa(port)) }
