package egress

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
)

// forward passes an allowed absolute-form http:// request on. While it is served it holds one of
// its client's places (MaxTunnelsPerClient), like a tunnel, whether its body is still coming or
// an upgrade (101) turned it into a raw connection, and it is ended when it moved nothing either
// way for TunnelIdleTimeout or when the proxy closes.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, dec adminclient.Decision, how dialing) {
	if !p.reserveTunnel(dec.Client) {
		w.Header().Set("Retry-After", "10")
		p.refuse(w, dec, adminclient.ReasonTooManyTunnels, http.StatusTooManyRequests)
		return
	}
	defer p.releaseTunnel(dec.Client)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	f := &forwarding{cancel: cancel, rc: http.NewResponseController(w), idle: p.idleTimeout()}
	if !p.trackForward(f) {
		http.Error(w, "egress proxy: shutting down", http.StatusServiceUnavailable)
		return
	}
	defer p.untrackForward(f)
	f.start()
	defer f.finish()

	out := &outcome{dialing: how}
	in := r.WithContext(context.WithValue(ctx, outcomeKey{}, out))
	if r.ContentLength != 0 {
		// The body is forwarded: undo ServeHTTP's leaveBody. The idle clock bounds the wait for
		// it, also when the forwarder closes it early (http.Server reads up to 256 kB more of it
		// then, to reuse the connection).
		w.Header().Del("Connection")
		f.rc.SetReadDeadline(time.Time{})
		in.Body = &activityBody{ReadCloser: in.Body, activity: &f.activity}
	}
	recorded := false
	defer func() {
		// The forwarder panics with http.ErrAbortHandler when the response breaks off (which
		// ending it does): the decision is logged all the same.
		if !recorded {
			p.Recorder.Record(dec)
		}
	}()
	p.forwarder.ServeHTTP(&forwardWriter{ResponseWriter: w, f: f}, in)
	recorded = true
	if out.err != nil && !f.wasEnded() {
		p.unreachable(w, dec, out.err)
		return
	}
	p.Recorder.Record(dec)
}

// forwarding is one forwarded request while the proxy serves it.
type forwarding struct {
	activity lastActivity
	cancel   context.CancelFunc       // cancels the upstream request
	rc       *http.ResponseController // the client's connection, until hijacked
	idle     time.Duration

	mu       sync.Mutex
	timer    *time.Timer
	finished bool     // forward returned: the client's connection is the server's again
	ended    bool     // cut short, idle or by Close
	conn     net.Conn // the client's connection, once an upgrade hijacked it
}

// start starts the idle clock.
func (f *forwarding) start() {
	f.activity.touch()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.timer = time.AfterFunc(f.idle, f.checkIdle)
}

func (f *forwarding) checkIdle() {
	if since := f.activity.since(); since < f.idle {
		f.mu.Lock()
		defer f.mu.Unlock()
		if !f.finished {
			f.timer.Reset(f.idle - since)
		}
		return
	}
	f.end()
}

// end cuts the request short: its upstream request is cancelled, and the client's connection
// closed if an upgrade hijacked it, or else given deadlines in the past, which fail the reads of
// its body and the writes of the answer, and so the server closes it.
func (f *forwarding) end() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.finished || f.ended {
		return
	}
	f.ended = true
	f.cancel()
	if f.conn != nil {
		f.conn.Close()
		return
	}
	past := time.Unix(1, 0)
	f.rc.SetReadDeadline(past)
	f.rc.SetWriteDeadline(past)
}

// finish stops the idle clock: after forward returns, the connection is not the request's.
func (f *forwarding) finish() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.finished = true
	f.timer.Stop()
}

func (f *forwarding) wasEnded() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ended
}

// hijacked takes the client's connection that an upgrade hijacked: it counts as activity what
// moves on it, and is closed when the request is ended.
func (f *forwarding) hijacked(c net.Conn) net.Conn {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ended {
		c.Close()
	}
	f.conn = c
	return &activityConn{Conn: c, activity: &f.activity}
}

// forwardWriter is the forwarder's ResponseWriter: what it writes is activity, and a connection
// it hijacks for an upgrade stays the request's.
type forwardWriter struct {
	http.ResponseWriter
	f *forwarding
}

func (w *forwardWriter) Write(b []byte) (int, error) {
	n, err := w.ResponseWriter.Write(b)
	if n > 0 {
		w.f.activity.touch()
	}
	return n, err
}

// Unwrap lets http.ResponseController reach the server's ResponseWriter (Flush).
func (w *forwardWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *forwardWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return c, brw, err
	}
	return w.f.hijacked(c), brw, nil
}

// activityBody is a forwarded request's body: what is read from it is activity.
type activityBody struct {
	io.ReadCloser
	activity *lastActivity
}

func (b *activityBody) Read(buf []byte) (int, error) {
	n, err := b.ReadCloser.Read(buf)
	if n > 0 {
		b.activity.touch()
	}
	return n, err
}

// activityConn is a hijacked client connection: what moves on it is activity.
type activityConn struct {
	net.Conn
	activity *lastActivity
}

func (c *activityConn) Read(buf []byte) (int, error) {
	n, err := c.Conn.Read(buf)
	if n > 0 {
		c.activity.touch()
	}
	return n, err
}

func (c *activityConn) Write(buf []byte) (int, error) {
	n, err := c.Conn.Write(buf)
	if n > 0 {
		c.activity.touch()
	}
	return n, err
}

// CloseWrite passes the upstream's half-close on, as tunnels do.
func (c *activityConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

func (p *Proxy) trackForward(f *forwarding) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	if p.forwards == nil {
		p.forwards = map[*forwarding]struct{}{}
	}
	p.forwards[f] = struct{}{}
	return true
}

func (p *Proxy) untrackForward(f *forwarding) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.forwards, f)
}
