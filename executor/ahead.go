package executor

import (
	"context"
	"crypto/tls"

	"github.com/sandbox-executor/sandbox-executor/agentca"
)

// AgentDial is a connection to a pod's agent made ahead of prepare's probe, while the pod is
// still being verified: the TCP connect and the TLS handshake (the agent's key pinned to the
// identity its pod logged, the job's client certificate presented) overlap the read of the pod.
// Nothing is sent on it until the verified pod shows the same address and identity
// (ConnectAgent); a pod that fails verification never gets a byte of the job. The agent binds
// its pod to a job only on a request, so a connection never used binds nothing.
type AgentDial struct {
	addr, identity string
	done           chan struct{}
	conn           *tls.Conn
	cancel         context.CancelFunc
}

// DialAhead starts connecting to the agent at podIP and port as job, pinning identity (the
// identity line's key). The connection is for ConnectAgent; Close releases it if unused.
func DialAhead(ctx context.Context, podIP string, port int, ca *agentca.CA, job, identity string) *AgentDial {
	ctx, cancel := context.WithCancel(ctx)
	d := &AgentDial{addr: agentAddr(podIP, port), identity: identity, done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(d.done)
		config, err := ca.ClientConfig(job, identity)
		if err != nil {
			return // ConnectAgent makes its own and says what is wrong
		}
		attempt, stop := context.WithTimeout(ctx, probeAnswer)
		defer stop()
		d.conn, _ = NewAgentNetwork(podIP, port, config, nil).connect(attempt)
	}()
	return d
}

// take hands over the connection if it reached addr pinning identity, nil otherwise (the
// caller then connects itself); either way the AgentDial is spent.
func (d *AgentDial) take(addr, identity string) *tls.Conn {
	if d == nil {
		return nil
	}
	<-d.done
	conn := d.conn
	d.conn = nil
	if conn != nil && (addr != d.addr || identity != d.identity) {
		conn.Close()
		conn = nil
	}
	return conn
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
