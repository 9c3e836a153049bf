package executor

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// AgentNetwork runs agent commands over the pod network, straight to the job's stage daemon,
// instead of through the API server and the kubelet: TLS 1.3, the agent's key pinned and the
// executor's client certificate presented (TLS). Anything else, and any agent command when the
// pod cannot be reached, goes to Fallback (exec). The stage protocol is the same either way: the
// same arguments, streams and status lines, so resuming and no-false-success hold as well.
type AgentNetwork struct {
	Addr     string
	TLS      *tls.Config
	Fallback kube.RemoteExecutor
	dialer   net.Dialer
}

// NewAgentNetwork reaches the daemon of the pod at podIP.
func NewAgentNetwork(podIP string, port int, config *tls.Config, fallback kube.RemoteExecutor) *AgentNetwork {
	return &AgentNetwork{
		Addr:     agentAddr(podIP, port),
		TLS:      config,
		Fallback: fallback,
		dialer:   net.Dialer{Timeout: 2 * time.Second, KeepAlive: 15 * time.Second},
	}
}

// Exec implements kube.RemoteExecutor.
func (a *AgentNetwork) Exec(ctx context.Context, req kube.ExecRequest) error {
	if len(req.Command) < 2 || req.Command[0] != wire.BinaryPath {
		return a.Fallback.Exec(ctx, req)
	}
	var stdin []byte
	if req.Stdin != nil {
		// Buffered, so a fallback to exec can send the same bytes again.
		data, err := io.ReadAll(req.Stdin)
		if err != nil {
			return err
		}
		stdin = data
	}
	err := a.exec(ctx, req, stdin)
	if errors.Is(err, ErrAgentUnreachable) && a.Fallback != nil {
		if req.Stdin != nil {
			req.Stdin = bytes.NewReader(stdin)
		}
		return a.Fallback.Exec(ctx, req) // pod network unreachable (policy, CNI): exec works anywhere
	}
	return err
}

// ErrAgentUnreachable: no connection to the agent could be made; nothing was sent.
var ErrAgentUnreachable = errors.New("stage agent unreachable over the pod network")

// exec sends one agent command with stdin; req.Stdin is not read.
func (a *AgentNetwork) exec(ctx context.Context, req kube.ExecRequest, stdin []byte) error {
	conn, err := a.connect(ctx)
	if err != nil {
		return err
	}
	return a.send(ctx, conn, req, stdin)
}

// connect makes a TLS connection to the agent, the handshake done (its key checked, this
// executor's certificate presented) and nothing sent: ErrAgentUnreachable when it cannot.
func (a *AgentNetwork) connect(ctx context.Context) (*tls.Conn, error) {
	raw, err := a.dialer.DialContext(ctx, "tcp", a.Addr)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: %v", ErrAgentUnreachable, err)
	}
	conn := tls.Client(raw, a.TLS)
	if err := conn.HandshakeContext(ctx); err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// Not the pod's agent (another key), or not an agent at all: nothing was sent.
		return nil, fmt.Errorf("%w: TLS with %s: %v", ErrAgentUnreachable, a.Addr, err)
	}
	return conn, nil
}

// send sends one agent command with stdin on conn, which it closes, and relays the answer.
func (a *AgentNetwork) send(ctx context.Context, conn *tls.Conn, req kube.ExecRequest, stdin []byte) error {
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if _, err := io.WriteString(conn, wire.RequestHeader(req.Command[1:], len(stdin))); err != nil {
		return err
	}
	if _, err := conn.Write(stdin); err != nil {
		return err
	}
	stdout, stderr := req.Stdout, req.Stderr
	if stdout == nil {
		stdout = io.Discard
	}
	// Only the head of stderr can be a refusal's reason; the rest of it is the stage's own.
	refusal := newHeadBuffer(maxKeptText)
	if stderr == nil {
		stderr = io.Discard
	}
	idle := &idleReader{conn: conn, timeout: networkIdleTimeout}
	code, err := wire.ReadFrames(bufio.NewReaderSize(idle, 256<<10), stdout, io.MultiWriter(stderr, refusal))
	var remote *net.OpError
	if errors.As(err, &remote) && remote.Op == "remote error" {
		// A TLS alert before any answer: the agent refused this client certificate (another
		// CA, or expired) and read nothing of the request.
		return fmt.Errorf("%w: the agent at %s refused this runner's client certificate (%v): does the pod's %s hold this runner's agent_ca_cert?", ErrAgentUnreachable, a.Addr, remote.Err, wire.ClientCAEnv)
	}
	if err != nil {
		return err
	}
	if code == wire.ExitRefused {
		return &RefusedError{Addr: a.Addr, Reason: refusal.Line()}
	}
	if code != 0 {
		return &kube.ExitError{Code: code}
	}
	return nil
}

// RefusedError is the agent refusing a network request (another job's, or bad arguments).
type RefusedError struct{ Addr, Reason string }

func (e *RefusedError) Error() string {
	return fmt.Sprintf("stage agent at %s refused the request: %s", e.Addr, e.Reason)
}

// networkIdleTimeout is how long a stream to the agent may carry nothing, not even a heartbeat
// (wire.HeartbeatEvery), before it counts as dropped. A pod whose gVisor sandbox died takes its
// network stack with it and sends no reset: without this, only TCP keepalive (minutes) would
// notice. Six heartbeats, so that agents on an older, slower heartbeat (15 s) are not cut.
const networkIdleTimeout = 6 * wire.HeartbeatEvery

// idleReader fails a read that waits longer than timeout.
type idleReader struct {
	conn    net.Conn
	timeout time.Duration
}

func (r *idleReader) Read(p []byte) (int, error) {
	if err := r.conn.SetReadDeadline(time.Now().Add(r.timeout)); err != nil {
		return 0, err
	}
	n, err := r.conn.Read(p)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		err = fmt.Errorf("no data nor heartbeat from the stage agent at %s for %s", r.conn.RemoteAddr(), r.timeout)
	}
	return n, err
}
