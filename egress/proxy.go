package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
	"github.com/sandbox-executor/sandbox-executor/egress/allowlist"
)

// DefaultDialTimeout bounds connecting to a destination.
const DefaultDialTimeout = 10 * time.Second

// Defaults of the tunnels' bounds: one job must not hold the proxy's connections (or file
// descriptors) that the others need, nor keep tunnels open that carry nothing.
const (
	DefaultMaxTunnelsPerClient = 256
	DefaultTunnelIdleTimeout   = 10 * time.Minute
)

// Proxy is the forward proxy's handler: CONNECT tunnels and absolute-form http:// requests to
// allowed destinations; everything else is refused with a body that names the destination.
type Proxy struct {
	Allowlist *allowlist.Allowlist
	// Grants widen the allowlist per client, for a job's lifetime (nil: none).
	Grants *Grants
	// Hosts resolves names without DNS. The operator wrote them, so they are trusted like IP
	// literals; names resolved by DNS must lead to public addresses (reachOf) unless a rule
	// names the address or the rule is the job's instance.
	Hosts    map[string]netip.Addr
	Recorder *Recorder
	// Resolver resolves the other names, as absolute names (nil: the system's).
	Resolver    Resolver
	DialTimeout time.Duration
	Now         func() time.Time
	// MaxTunnelsPerClient bounds the connections one client (source address) holds open through
	// the proxy at once, CONNECT tunnels and forwarded requests (upgraded or not) alike (0:
	// DefaultMaxTunnelsPerClient); more are refused with 429.
	MaxTunnelsPerClient int
	// TunnelIdleTimeout ends a tunnel or a forwarded request that carried nothing either way for
	// that long (0: DefaultTunnelIdleTimeout).
	TunnelIdleTimeout time.Duration

	// dialContext connects (nil: a net.Dialer); tests see what is dialled.
	dialContext func(ctx context.Context, network, address string) (net.Conn, error)

	once      sync.Once
	transport *http.Transport
	forwarder *httputil.ReverseProxy

	mu      sync.Mutex
	tunnels map[net.Conn]struct{}
	// forwards are the forwarded requests being served.
	forwards map[*forwarding]struct{}
	// perClient counts the tunnels and forwarded requests open or being opened per client
	// address.
	perClient map[string]int
	closed    bool
}

// Resolver resolves names to addresses (*net.Resolver does).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// errNonPublic marks a name that resolved to an address a proxy must not be steered to
// (the proxy's own loopback, cloud metadata at 169.254.169.254, the cluster's network, ...).
var errNonPublic = errors.New(adminclient.ReasonNonPublicIP)

// dialing is what the dial of one allowed request needs to know: whom it is for and which rule
// allowed it, to decide which addresses its name may lead to.
type dialing struct {
	client netip.Addr
	rule   allowlist.Rule
}

func (p *Proxy) init() {
	p.once.Do(func() {
		p.transport = &http.Transport{
			Proxy: nil, // never chain to a proxy from the environment
			DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
				d, err := allowlist.ParseDest(addr, 0)
				if err != nil {
					return nil, err
				}
				return p.dial(ctx, d, outcomeFrom(ctx).dialing)
			},
			MaxIdleConnsPerHost:   4,
			IdleConnTimeout:       90 * time.Second,
			ResponseHeaderTimeout: 5 * time.Minute,
		}
		p.forwarder = &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.Out.Host = pr.In.Host
				// The transport keeps connections per host, not per client: one dialled under a
				// grant (which may reach private addresses) must not serve another client.
				pr.Out.Close = outcomeOf(pr.In).dialing.granted()
			},
			Transport:    p.transport,
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) { outcomeOf(r).err = err },
		}
	})
}

func (p *Proxy) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

// ServeHTTP implements http.Handler.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.init()
	if r.Method != http.MethodConnect && r.ContentLength != 0 {
		leaveBody(w) // until forward takes the body on
	}
	dec := adminclient.Decision{Time: p.now(), Client: clientIP(r.RemoteAddr), Method: r.Method}
	var dest allowlist.Dest
	var err error
	switch {
	case r.Method == http.MethodConnect:
		dec.Dest = r.Host
		dest, err = allowlist.ParseDest(r.Host, 0)
	case r.URL.IsAbs() && r.URL.Scheme == "http":
		dec.Dest = r.URL.Host
		dest, err = allowlist.ParseDest(r.URL.Host, 80)
	case r.URL.IsAbs():
		http.Error(w, "egress proxy: only http:// URLs are forwarded; https goes through CONNECT (set HTTPS_PROXY)", http.StatusBadRequest)
		return
	default:
		http.Error(w, "egress proxy: this is a forward proxy: send CONNECT or an absolute http:// URL (set HTTP_PROXY)", http.StatusBadRequest)
		return
	}
	if err != nil {
		dec.Reason = adminclient.ReasonBadDest
		p.Recorder.Record(dec)
		http.Error(w, fmt.Sprintf("egress proxy: %s blocked: %s", r.Method, truncateErr(err)), http.StatusBadRequest)
		return
	}
	dec.Dest = dest.String()
	rule, ok := p.Allowlist.Match(dest)
	if !ok {
		rule, ok = p.grantFor(dec.Client, dest, dec.Time)
	}
	if !ok {
		p.block(w, dec, adminclient.ReasonNotAllowed)
		return
	}
	dec.Allowed, dec.Rule = true, rule.Text
	client, _ := netip.ParseAddr(dec.Client)
	how := dialing{client: client, rule: rule}
	if r.Method == http.MethodConnect {
		p.tunnel(w, r, dest, dec, how)
		return
	}
	p.forward(w, r, dec, how)
}

// leaveBody makes the server close the connection rather than wait for the rest of a request
// body that nothing will read: before answering, and after to reuse the connection, http.Server
// reads what is left of it, for as long as the client takes to send it. The header has no
// effect once the answer's is written.
func leaveBody(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	http.NewResponseController(w).SetReadDeadline(time.Unix(1, 0))
}

// grantPrefix names a granted rule in decisions.
const grantPrefix = "grant "

// grantFor matches dest against the client's grant; a granted rule is named "grant <rule>".
func (p *Proxy) grantFor(client string, dest allowlist.Dest, now time.Time) (allowlist.Rule, bool) {
	addr, err := netip.ParseAddr(client)
	if err != nil || p.Grants == nil {
		return allowlist.Rule{}, false
	}
	rule, ok := p.Grants.Match(addr, dest, now)
	rule.Text = grantPrefix + rule.Text
	return rule, ok
}

func (p *Proxy) block(w http.ResponseWriter, dec adminclient.Decision, reason string) {
	p.refuse(w, dec, reason, http.StatusForbidden)
}

// refuse records dec as blocked for reason and answers with status.
func (p *Proxy) refuse(w http.ResponseWriter, dec adminclient.Decision, reason string, status int) {
	dec.Allowed, dec.Rule, dec.Reason = false, "", reason
	p.Recorder.Record(dec)
	http.Error(w, fmt.Sprintf("egress proxy: %s %s blocked: %s", dec.Method, dec.Dest, reason), status)
}

// unreachable answers for an allowed destination that could not be reached.
func (p *Proxy) unreachable(w http.ResponseWriter, dec adminclient.Decision, err error) {
	if errors.Is(err, errNonPublic) {
		p.block(w, dec, adminclient.ReasonNonPublicIP)
		return
	}
	dec.Error = truncateErr(err)
	p.Recorder.Record(dec)
	http.Error(w, fmt.Sprintf("egress proxy: %s %s is allowed (rule %s) but unreachable: %s", dec.Method, dec.Dest, dec.Rule, dec.Error), http.StatusBadGateway)
}

func (p *Proxy) tunnel(w http.ResponseWriter, r *http.Request, dest allowlist.Dest, dec adminclient.Decision, how dialing) {
	if !p.reserveTunnel(dec.Client) {
		w.Header().Set("Retry-After", "10")
		p.refuse(w, dec, adminclient.ReasonTooManyTunnels, http.StatusTooManyRequests)
		return
	}
	defer p.releaseTunnel(dec.Client)
	upstream, err := p.dial(r.Context(), dest, how)
	if err != nil {
		p.unreachable(w, dec, err)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		upstream.Close()
		http.Error(w, "egress proxy: CONNECT needs HTTP/1.1", http.StatusHTTPVersionNotSupported)
		return
	}
	client, buffered, err := hj.Hijack()
	if err != nil {
		upstream.Close()
		return
	}
	p.Recorder.Record(dec)
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		client.Close()
		upstream.Close()
		return
	}
	// Bytes the client sent right behind its CONNECT (e.g. a TLS ClientHello) are already read.
	if n := buffered.Reader.Buffered(); n > 0 {
		early, _ := buffered.Reader.Peek(n)
		if _, err := upstream.Write(early); err != nil {
			client.Close()
			upstream.Close()
			return
		}
	}
	p.splice(client, upstream)
}

// splice copies both ways until both directions are done, passing half-closes on, and is cut
// short by Close or when nothing moved either way for TunnelIdleTimeout.
func (p *Proxy) splice(a, b net.Conn) {
	if !p.track(a, b) {
		return
	}
	defer p.untrack(a, b)
	idle := p.idleTimeout()
	activity := &lastActivity{}
	activity.touch()
	var wg sync.WaitGroup
	wg.Add(2)
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		_, err := io.Copy(dst, &idleReader{conn: src, idle: idle, activity: activity})
		if isTimeout(err) {
			a.Close() // idle: end both ways, unblocking the other direction's read
			b.Close()
			return
		}
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		} else {
			dst.Close()
		}
	}
	go pipe(a, b)
	go pipe(b, a)
	wg.Wait()
	a.Close()
	b.Close()
}

// lastActivity is when a tunnel last moved a byte, either way.
type lastActivity struct{ nanos atomic.Int64 }

func (l *lastActivity) touch() { l.nanos.Store(time.Now().UnixNano()) }

func (l *lastActivity) since() time.Duration { return time.Since(time.Unix(0, l.nanos.Load())) }

// idleReader reads one direction of a tunnel, ending with a timeout only when the whole tunnel
// was idle for idle: a long download keeps its silent upload direction open.
type idleReader struct {
	conn     net.Conn
	idle     time.Duration
	activity *lastActivity
}

func (r *idleReader) Read(buf []byte) (int, error) {
	for {
		r.conn.SetReadDeadline(time.Now().Add(r.idle))
		n, err := r.conn.Read(buf)
		if n > 0 {
			r.activity.touch()
			return n, err
		}
		if isTimeout(err) && r.activity.since() < r.idle {
			continue // the other direction moved meanwhile
		}
		return n, err
	}
}

func isTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

// reserveTunnel counts one more tunnel for client, unless it holds the most it may.
func (p *Proxy) reserveTunnel(client string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.perClient[client] >= p.maxTunnels() {
		return false
	}
	if p.perClient == nil {
		p.perClient = map[string]int{}
	}
	p.perClient[client]++
	return true
}

func (p *Proxy) releaseTunnel(client string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.perClient[client]--; p.perClient[client] <= 0 {
		delete(p.perClient, client)
	}
}

func (p *Proxy) idleTimeout() time.Duration {
	if p.TunnelIdleTimeout > 0 {
		return p.TunnelIdleTimeout
	}
	return DefaultTunnelIdleTimeout
}

func (p *Proxy) maxTunnels() int {
	if p.MaxTunnelsPerClient > 0 {
		return p.MaxTunnelsPerClient
	}
	return DefaultMaxTunnelsPerClient
}

func (p *Proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	if p.tunnels == nil {
		p.tunnels = map[net.Conn]struct{}{}
	}
	for _, c := range conns {
		p.tunnels[c] = struct{}{}
	}
	return true
}

func (p *Proxy) untrack(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		delete(p.tunnels, c)
	}
}

// Close cuts every open tunnel, forwarded request and idle upstream connection, and the proxy
// forwards nothing after it; http.Server.Shutdown does not know hijacked connections, and waits
// for requests in flight.
func (p *Proxy) Close() {
	p.init()
	p.mu.Lock()
	p.closed = true
	for c := range p.tunnels {
		c.Close()
	}
	for f := range p.forwards {
		f.end()
	}
	p.mu.Unlock()
	p.transport.CloseIdleConnections()
}

// outcome carries a forwarded request's dialing to the transport's dial, and its error back.
type outcome struct {
	dialing dialing
	err     error
}

type outcomeKey struct{}

func outcomeFrom(ctx context.Context) *outcome { return ctx.Value(outcomeKey{}).(*outcome) }

func outcomeOf(r *http.Request) *outcome { return outcomeFrom(r.Context()) }

// dial connects to an allowed destination: an IP literal or a name of Hosts as it is, other
// names resolved once, as absolute names (a pod's search domains must not turn "gitlab" into
// "gitlab.internal.corp"), and only to the addresses checked.
func (p *Proxy) dial(ctx context.Context, d allowlist.Dest, how dialing) (net.Conn, error) {
	timeout := p.DialTimeout
	if timeout <= 0 {
		timeout = DefaultDialTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	dial := p.dialContext
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	port := strconv.Itoa(d.Port)
	if d.Addr.IsValid() {
		return dial(ctx, "tcp", net.JoinHostPort(d.Addr.String(), port))
	}
	if a, ok := p.Hosts[d.Host]; ok {
		return dial(ctx, "tcp", net.JoinHostPort(a.String(), port))
	}
	var resolver Resolver = net.DefaultResolver
	if p.Resolver != nil {
		resolver = p.Resolver
	}
	addrs, err := resolver.LookupNetIP(ctx, "ip", d.Host+".")
	if err != nil {
		return nil, err
	}
	for i, a := range addrs {
		addrs[i] = a.Unmap()
		if !p.mayReach(how, addrs[i], d.Port) {
			return nil, fmt.Errorf("%s resolves to %s: %w", d.Host, addrs[i], errNonPublic)
		}
	}
	var firstErr error
	for _, a := range addrs {
		c, err := dial(ctx, "tcp", net.JoinHostPort(a.String(), port))
		if err == nil {
			return c, nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	if firstErr == nil {
		firstErr = fmt.Errorf("%s has no address", d.Host)
	}
	return nil, firstErr
}

// mayReach tells whether a name allowed by how.rule may lead to a: a public address, one that
// an IP or network rule names (the proxy's or the client's grant), or for the job's instance a
// private one.
func (p *Proxy) mayReach(how dialing, a netip.Addr, port int) bool {
	switch reachOf(a) {
	case public:
		return true
	case private:
		if how.rule.Private {
			return true
		}
	}
	return p.Allowlist.Addresses(a, port) || p.Grants.Addresses(how.client, a, port, p.now())
}

// granted tells whether a grant (the client's own) allowed the request.
func (how dialing) granted() bool { return strings.HasPrefix(how.rule.Text, grantPrefix) }

func clientIP(remoteAddr string) string {
	if ap, err := netip.ParseAddrPort(remoteAddr); err == nil {
		return ap.Addr().Unmap().String()
	}
	return remoteAddr
}
