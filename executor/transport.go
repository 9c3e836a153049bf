package executor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// Transport is how the stages of a job reach its pod's agent: over the pod network, straight to
// the agent and authenticated by the job's token, or over exec through the API server.
type Transport struct {
	// AgentToken authenticates the network path; empty: exec. It lives in the runner's per-job
	// TMPDIR (0600) and in the pod, nowhere else, and is never printed.
	AgentToken string
}

// Network reports whether the stages go over the pod network.
func (t Transport) Network() bool { return t.AgentToken != "" }

// String names the transport for the job log; it never shows the token.
func (t Transport) String() string {
	if t.Network() {
		return "pod network"
	}
	return "exec"
}

// GoString keeps the token out of %#v too.
func (t Transport) GoString() string { return "executor.Transport{" + t.String() + "}" }

// Executor is what the stages run agent commands with: the network path with exec behind it,
// or exec alone.
func (t Transport) Executor(sbx *kube.Sandbox, exec kube.RemoteExecutor) kube.RemoteExecutor {
	if t.Network() && sbx.PodIP != "" {
		return NewAgentNetwork(sbx.PodIP, t.AgentToken, exec)
	}
	return exec
}

// probeAnswer bounds one probe over the pod network: the agent answers in milliseconds.
const probeAnswer = 3 * time.Second

// tokenTakeover bounds how long the baked-in agent may take to read a token from its stdin.
const tokenTakeover = 5 * time.Second

// ConnectAgent readies a pod whose template bakes the agent in (sbx.AgentBaked): its stage
// daemon runs already, so nothing is copied and no process is started. With a token, the token
// is written to the job container's stdin (attach, not exec: no process start in the pod) and
// the agent is probed over the pod network at port. Without one, or when the pod cannot be
// reached, the probe goes over exec and so will the stages.
func ConnectAgent(ctx context.Context, exec kube.RemoteExecutor, attach kube.Attacher, sbx *kube.Sandbox, port int, token string) (Transport, *wire.Probe, error) {
	if token != "" {
		transport, probe, err := handOverToken(ctx, attach, sbx, port, token)
		if err != nil || transport.Network() {
			return transport, probe, err
		}
	}
	var stdout, stderr bytes.Buffer
	err := exec.Exec(ctx, kube.ExecRequest{Namespace: sbx.Namespace, Pod: sbx.Pod, Container: sbx.Container, Command: []string{wire.BinaryPath, "probe"}, Stdout: &stdout, Stderr: &stderr})
	if err != nil {
		return Transport{}, nil, failure.SystemError(err, "probing the stage agent in pod %s/%s: %s", sbx.Namespace, sbx.Pod, failure.OneLine(strings.TrimSpace(stderr.String()+" "+err.Error())))
	}
	probe, err := parseProbe(sbx, stdout.Bytes())
	return Transport{}, probe, err
}

// handOverToken writes the token to the job container's stdin (pods/attach) and probes the agent
// over the pod network meanwhile: the probe answers as soon as the agent has read the token, and
// the attach stream's own teardown through the kubelet (tens of milliseconds under gVisor) is not
// waited for. An attach that fails before the agent has the token fails the handover.
func handOverToken(ctx context.Context, attach kube.Attacher, sbx *kube.Sandbox, port int, token string) (Transport, *wire.Probe, error) {
	attachCtx, cancelAttach := context.WithCancel(ctx)
	var attachErr error
	attached := make(chan struct{})
	go func() {
		defer close(attached)
		attachErr = attach.Attach(attachCtx, kube.ExecRequest{Namespace: sbx.Namespace, Pod: sbx.Pod, Container: sbx.Container, Stdin: strings.NewReader(token + "\n")})
	}()
	defer func() {
		cancelAttach()
		<-attached // the stream is closed before prepare goes on
	}()
	var transport Transport
	var probe *wire.Probe
	var probeErr error
	probed := make(chan struct{})
	probeCtx, cancelProbe := context.WithCancel(ctx)
	defer cancelProbe()
	go func() {
		defer close(probed)
		transport, probe, probeErr = ChooseTransport(probeCtx, sbx, port, token)
	}()
	select {
	case <-probed:
		if probeErr == nil {
			// The agent has the token (the attach has done its job), or the pod cannot be
			// reached (stages go over exec, which needs no token).
			return transport, probe, nil
		}
		<-attached // a failed attach is the likelier cause of a refused probe
	case <-attached:
		if attachErr != nil {
			cancelProbe()
		}
		<-probed
	}
	if attachErr != nil {
		return Transport{}, nil, failure.SystemError(attachErr, "handing the job's agent token to pod %s/%s (pods/attach): %s", sbx.Namespace, sbx.Pod, failure.OneLine(attachErr.Error()))
	}
	return transport, probe, probeErr
}

// ChooseTransport decides how the stages reach the pod's agent: it asks the agent at the pod's
// address and port for its probe with token, waiting while the agent has not taken the token
// yet. The network transport and the probe when the agent answered; the exec transport and no
// probe when the pod cannot be reached over the network (policy, CNI, no IP); an error when the
// agent answered but not as it should.
func ChooseTransport(ctx context.Context, sbx *kube.Sandbox, port int, token string) (Transport, *wire.Probe, error) {
	if sbx.PodIP == "" {
		return Transport{}, nil, nil
	}
	daemon := &AgentNetwork{
		Addr:   net.JoinHostPort(sbx.PodIP, strconv.Itoa(port)),
		Token:  token,
		dialer: net.Dialer{Timeout: time.Second, KeepAlive: 15 * time.Second},
	}
	deadline := time.Now().Add(tokenTakeover)
	// Short waits: a refusal costs a loopback-fast connection, and the token is usually read
	// within a few tens of milliseconds of the attach.
	retry := wait.Backoff{Duration: 2 * time.Millisecond, Factor: 2, Steps: math.MaxInt32, Cap: 20 * time.Millisecond}
	for {
		var stdout bytes.Buffer
		attempt, cancel := context.WithTimeout(ctx, probeAnswer)
		err := daemon.exec(attempt, kube.ExecRequest{Command: []string{wire.BinaryPath, "probe"}, Stdout: &stdout, Stderr: io.Discard}, nil)
		if err != nil && ctx.Err() == nil && attempt.Err() != nil {
			// Something at the pod's address took the connection but never answered: not
			// our agent, or a wedged one. Exec still reaches the pod.
			err = fmt.Errorf("%w: %s did not answer within %s", ErrAgentUnreachable, daemon.Addr, probeAnswer)
		}
		cancel()
		var refused *RefusedError
		switch {
		case err == nil:
			probe, err := parseProbe(sbx, stdout.Bytes())
			if err != nil {
				return Transport{}, nil, err
			}
			return Transport{AgentToken: token}, probe, nil
		case errors.Is(err, ErrAgentUnreachable):
			return Transport{}, nil, nil
		case !errors.As(err, &refused) || time.Now().After(deadline):
			return Transport{}, nil, failure.SystemError(err, "the stage agent in pod %s: %s", sbx.Pod, failure.OneLine(err.Error()))
		}
		// Refused: the daemon has not read the token yet.
		select {
		case <-time.After(retry.Step()):
		case <-ctx.Done():
			return Transport{}, nil, ctx.Err()
		}
	}
}
