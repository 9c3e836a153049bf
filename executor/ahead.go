package executor

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agentca"
)

// AgentDial is a connection to a pod's agent made ahead of prepare's probe, while the pod is
// still being verified: the TCP connect and the TLS handshake (the agent's key pinned to the
// identity its pod logged, the job's client certificate presented) overlap the read of the pod.
// No request is sent on it until the verified pod shows the same address and identity
// (ConnectAgent), and the agent binds its pod to a job only on a request: a connection that is
// dropped binds nothing. The handshake shows the agent only the job's client certificate, which
// is public (docs/security.md#the-connection-made-ahead).
type AgentDial struct {
	addr, identity string
	done           chan struct{}
	cancel         context.CancelFunc
	// Set once done is closed: the connection, or why there is none, and when it was made.
	conn *tls.Conn
	err  error
	at   time.Time
}

// aheadFresh bounds the age of a connection made ahead: the agent gives a connection 10 s from
// its accept to send a request (agent.serveConn), so an older one may be closed already.
const aheadFresh = 5 * time.Second

// DialAhead starts connecting to the agent at podIP and port as job, pinning identity (the
// identity line's key). The connection is for ConnectAgent; Close releases it if unused.
func DialAhead(ctx context.Context, podIP string, port int, ca *agentca.CA, job, identity string) *AgentDial {
	ctx, cancel := context.WithCancel(ctx)
	d := &AgentDial{addr: agentAddr(podIP, port), identity: identity, done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(d.done)
		config, err := ca.ClientConfig(job, identity)
		if err != nil {
			d.err = err
			return
		}
		attempt, stop := context.WithTimeout(ctx, probeAnswer)
		defer stop()
		d.conn, d.err = NewAgentNetwork(podIP, port, config, nil).connect(attempt)
		if d.err != nil && ctx.Err() == nil && attempt.Err() != nil {
			d.err = fmt.Errorf("%w: %s did not answer within %s", ErrAgentUnreachable, d.addr, probeAnswer)
		}
		d.at = time.Now()
	}()
	return d
}

// take is the attempt made ahead, if it was to addr pinning identity: its connection, or the
// reason the agent could not be reached (ErrAgentUnreachable: the caller's own attempt, made
// earlier). matched is false for anything else, which the caller connects for itself: another
// pod, another key, a connection gone stale. Either way the AgentDial is spent.
func (d *AgentDial) take(addr, identity string) (conn *tls.Conn, matched bool, unreachable error) {
	if d == nil {
		return nil, false, nil
	}
	if addr != d.addr || identity != d.identity {
		d.Close() // without waiting for a connection nobody will use
		return nil, false, nil
	}
	<-d.done
	conn, d.conn = d.conn, nil
	switch {
	case conn != nil && time.Since(d.at) < aheadFresh:
		return conn, true, nil
	case conn != nil:
		conn.Close()
		return nil, false, nil
	case errors.Is(d.err, ErrAgentUnreachable):
		return nil, true, d.err
	}
	return nil, false, nil
}

// Close releases a connection that was not taken.
func (d *AgentDial) Close() {
	if d == nil {
		return
	}
	d.cancel()
	<-d.done
	if d.conn != nil {
		d.conn.Close()
		d.conn = nil
	}
}
