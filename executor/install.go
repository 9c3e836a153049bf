package executor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/sandbox-executor/sandbox-executor/executor/agent"
)

// receiveFile defines receive FILE SIZE for the install scripts: it reads stdin to its end into
// FILE.new, checks that all SIZE bytes arrived (a dropped stream must not leave a truncated
// binary behind), makes it executable and renames it into place. POSIX sh and coreutils only.
const receiveFile = `receive() { cat > "$1.new" && n=$(wc -c < "$1.new") && if [ "$n" -ne "$2" ]; then echo "received $n of $2 bytes" >&2; return 1; fi && chmod 700 "$1.new" && mv -f "$1.new" "$1"; } && `

// installScript reads a line (the network path's token, or nothing) and then the agent from
// stdin into the pod's private directory, and runs its init: start the job's stage daemon, then
// report on the pod. The shell's read takes the line byte by byte, leaving the binary on stdin,
// and the token never appears in an argument list.
const installScript = receiveFile + `umask 077 && IFS= read -r t && mkdir -p "$1/stages" && receive "$1/agent" "$2" && d=$1 && shift 2 && printf %s "$t" | "$d/agent" init "$@"`

// InstallAgent copies the stage agent into the pod over exec stdin, in the one exec that prepare
// pays anyway, and returns what the agent found (shell, kernel). With a token, the agent's daemon
// also serves the network path (AgentNetwork), authenticated by it.
func InstallAgent(ctx context.Context, ex RemoteExecutor, sbx *Sandbox, binary []byte, token string) (*agent.Probe, error) {
	var stdout, stderr bytes.Buffer
	command := []string{"/bin/sh", "-c", installScript, "sh", agent.BaseDir, strconv.Itoa(len(binary))}
	if token != "" {
		command = append(command, "--listen", ":"+strconv.Itoa(agent.NetworkPort))
	}
	err := ex.Exec(ctx, ExecRequest{
		Namespace: sbx.Namespace, Pod: sbx.Pod, Container: sbx.Container,
		Command: command,
		Stdin:   io.MultiReader(strings.NewReader(token+"\n"), bytes.NewReader(binary)),
		Stdout:  &stdout,
		Stderr:  &stderr,
	})
	if err := installError(err, &stderr, sbx, "the stage agent"); err != nil {
		return nil, err
	}
	return parseProbe(sbx, stdout.Bytes())
}

func parseProbe(sbx *Sandbox, out []byte) (*agent.Probe, error) {
	var probe agent.Probe
	if err := json.Unmarshal(out, &probe); err != nil {
		return nil, SystemError(nil, "the stage agent in pod %s answered its probe with %q", sbx.Pod, oneLine(string(out)))
	}
	return &probe, nil
}

// installError turns a failed install exec into the error prepare reports: a missing shell is
// the image's fault (permanent), anything else the infrastructure's.
func installError(err error, stderr *bytes.Buffer, sbx *Sandbox, what string) error {
	if err == nil {
		return nil
	}
	reason := strings.TrimSpace(stderr.String())
	if reason == "" {
		reason = err.Error()
	}
	var exit *ExitError
	switch {
	case errors.As(err, &exit):
		return SystemError(nil, "installing %s in pod %s failed (exit %d): %s", what, sbx.Pod, exit.Code, oneLine(reason))
	case strings.Contains(reason, "executable file not found") || strings.Contains(reason, "no such file"):
		return PermanentError(nil, "the job image has no /bin/sh: sandbox-executor needs a POSIX shell in the image")
	default:
		return SystemError(nil, "exec into pod %s/%s failed: %s", sbx.Namespace, sbx.Pod, oneLine(reason))
	}
}

// agentPort is agent.NetworkPort; tests that run the agent on the host move it.
var agentPort = agent.NetworkPort

// probeAnswer bounds one probe over the pod network: the agent answers in milliseconds.
const probeAnswer = 3 * time.Second

// tokenTakeover bounds how long the baked-in agent may take to read a token from its stdin.
const tokenTakeover = 5 * time.Second

// ConnectAgent readies a pod whose template bakes the agent in (sbx.AgentBaked): its stage
// daemon runs already, so nothing is copied and no process is started. With a token, the token
// is written to the job container's stdin (attach, not exec: no process start in the pod) and
// the agent is probed over the pod network. Without one, the probe goes over exec.
func ConnectAgent(ctx context.Context, clients *Clients, sbx *Sandbox, token string) (*agent.Probe, error) {
	if token != "" {
		probe, err := handOverToken(ctx, clients, sbx, token)
		if err == nil || !errors.Is(err, ErrAgentUnreachable) {
			return probe, err
		}
	}
	var stdout, stderr bytes.Buffer
	err := clients.Exec.Exec(ctx, ExecRequest{Namespace: sbx.Namespace, Pod: sbx.Pod, Container: sbx.Container, Command: []string{agent.BinaryPath, "probe"}, Stdout: &stdout, Stderr: &stderr})
	if err != nil {
		return nil, SystemError(err, "probing the stage agent in pod %s/%s: %s", sbx.Namespace, sbx.Pod, oneLine(strings.TrimSpace(stderr.String()+" "+err.Error())))
	}
	return parseProbe(sbx, stdout.Bytes())
}

// handOverToken writes the token to the job container's stdin (pods/attach) and probes the agent
// over the pod network meanwhile: the probe answers as soon as the agent has read the token, and
// the attach stream's own teardown through the kubelet (tens of milliseconds under gVisor) is not
// waited for. An attach that fails before the agent has the token fails the handover.
func handOverToken(ctx context.Context, clients *Clients, sbx *Sandbox, token string) (*agent.Probe, error) {
	attachCtx, cancelAttach := context.WithCancel(ctx)
	var attachErr error
	attached := make(chan struct{})
	go func() {
		defer close(attached)
		attachErr = clients.Attach.Attach(attachCtx, ExecRequest{Namespace: sbx.Namespace, Pod: sbx.Pod, Container: sbx.Container, Stdin: strings.NewReader(token + "\n")})
	}()
	defer func() {
		cancelAttach()
		<-attached // the stream is closed before prepare goes on
	}()
	var probe *agent.Probe
	var probeErr error
	probed := make(chan struct{})
	probeCtx, cancelProbe := context.WithCancel(ctx)
	defer cancelProbe()
	go func() {
		defer close(probed)
		probe, probeErr = ProbeOverNetwork(probeCtx, sbx, token)
	}()
	select {
	case <-probed:
		switch {
		case probeErr == nil:
			return probe, nil // the agent has the token: the attach has done its job
		case errors.Is(probeErr, ErrAgentUnreachable):
			return nil, probeErr // stages go over exec, which needs no token
		}
		<-attached // a failed attach is the likelier cause of a refused probe
	case <-attached:
		if attachErr != nil {
			cancelProbe()
		}
		<-probed
	}
	if attachErr != nil {
		return nil, SystemError(attachErr, "handing the job's agent token to pod %s/%s (pods/attach): %s", sbx.Namespace, sbx.Pod, oneLine(attachErr.Error()))
	}
	return probe, probeErr
}

// ProbeOverNetwork asks the pod's stage daemon for its probe with token, waiting while the
// daemon has not taken the token yet. It sets sbx.AgentToken when the daemon answered, so the
// stages go over the network; an error wrapping ErrAgentUnreachable means they must go over exec.
func ProbeOverNetwork(ctx context.Context, sbx *Sandbox, token string) (*agent.Probe, error) {
	if sbx.PodIP == "" {
		sbx.AgentToken = ""
		return nil, fmt.Errorf("%w: pod %s has no IP", ErrAgentUnreachable, sbx.Pod)
	}
	daemon := NewAgentNetwork(sbx.PodIP, token, nil)
	daemon.Addr = net.JoinHostPort(sbx.PodIP, strconv.Itoa(agentPort))
	daemon.dialer.Timeout = time.Second
	deadline := time.Now().Add(tokenTakeover)
	// Short waits: a refusal costs a loopback-fast connection, and the token is usually read
	// within a few tens of milliseconds of the attach.
	for wait := 2 * time.Millisecond; ; wait = min(2*wait, 20*time.Millisecond) {
		var stdout bytes.Buffer
		attempt, cancel := context.WithTimeout(ctx, probeAnswer)
		err := daemon.exec(attempt, ExecRequest{Command: []string{agent.BinaryPath, "probe"}, Stdout: &stdout, Stderr: io.Discard}, nil)
		if err != nil && ctx.Err() == nil && attempt.Err() != nil {
			// Something at the pod's address took the connection but never answered: not
			// our agent, or a wedged one. Exec still reaches the pod.
			err = fmt.Errorf("%w: %s did not answer within %s", ErrAgentUnreachable, daemon.Addr, probeAnswer)
		}
		cancel()
		var refused *RefusedError
		switch {
		case err == nil:
			sbx.AgentToken = token
			return parseProbe(sbx, stdout.Bytes())
		case errors.Is(err, ErrAgentUnreachable):
			sbx.AgentToken = ""
			return nil, err
		case !errors.As(err, &refused) || time.Now().After(deadline):
			return nil, SystemError(err, "the stage agent in pod %s: %s", sbx.Pod, oneLine(err.Error()))
		}
		// Refused: the daemon has not read the token yet.
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}
