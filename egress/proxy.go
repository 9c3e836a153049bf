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
	"strconv"
	"sync"
	"time"

	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
	"github.com/sandbox-executor/sandbox-executor/egress/allowlist"
)

// DefaultDialTimeout bounds connecting to a destination.
const DefaultDialTimeout = 10 * time.Second

// Proxy is the forward proxy's handler: CONNECT tunnels and absolute-form http:// requests to
// allowed destinations; everything else is refused with a body that names the destination.
type Proxy struct {
	Allowlist *allowlist.Allowlist
	// Grants widen the allowlist per client, for a job's lifetime (nil: none).
	Grants *Grants
	// Hosts resolves names without DNS. The operator wrote them, so they are trusted like IP
	// literals; names resolved by DNS must not lead to loopback or link-local addresses.
	Hosts    map[string]netip.Addr
	Recorder *Recorder
	// Resolver resolves the other names (nil: the system's).
	Resolver    *net.Resolver
	DialTimeout time.Duration
	Now         func() time.Time

	once      sync.Once
	transport *http.Transport
	forwarder *httputil.ReverseProxy

	mu      sync.Mutex
	tunnels map[net.Conn]struct{}
	closed  bool
}

// errNonPublic marks a name that resolved to an address a proxy must never be steered to
// (the proxy's own loopback, cloud metadata at 169.254.169.254, ...).
var errNonPublic = errors.New(adminclient.ReasonNonPublicIP)

func (p *Proxy) init() {
	p.once.Do(func() {
		p.transport = &http.Transport{
			Proxy: nil, // never chain to a proxy from the environment
			DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
				d, err := allowlist.ParseDest(addr, 0)
				if err != nil {
					return nil, err
				}
				return p.dial(ctx, d)
			},
			MaxIdleConnsPerHost:   4,
			IdleConnTimeout:       90 * time.Second,
			ResponseHeaderTimeout: 5 * time.Minute,
		}
		p.forwarder = &httputil.ReverseProxy{
			Rewrite:      func(pr *httputil.ProxyRequest) { pr.Out.Host = pr.In.Host },
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
	if r.Method == http.MethodConnect {
		p.tunnel(w, r, dest, dec)
		return
	}
	p.forward(w, r, dec)
}

// grantFor matches dest against the client's grant; a granted rule is named "grant <rule>".
func (p *Proxy) grantFor(client string, dest allowlist.Dest, now time.Time) (allowlist.Rule, bool) {
	addr, err := netip.ParseAddr(client)
	if err != nil || p.Grants == nil {
		return allowlist.Rule{}, false
	}
	rule, ok := p.Grants.Match(addr, dest, now)
	rule.Text = "grant " + rule.Text
	return rule, ok
}

func (p *Proxy) block(w http.ResponseWriter, dec adminclient.Decision, reason string) {
	dec.Allowed, dec.Rule, dec.Reason = false, "", reason
	p.Recorder.Record(dec)
	http.Error(w, fmt.Sprintf("egress proxy: %s %s blocked: %s", dec.Method, dec.Dest, reason), http.StatusForbidden)
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

func (p *Proxy) tunnel(w http.ResponseWriter, r *http.Request, dest allowlist.Dest, dec adminclient.Decision) {
	upstream, err := p.dial(r.Context(), dest)
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
// short by Close.
func (p *Proxy) splice(a, b net.Conn) {
	if !p.track(a, b) {
		return
	}
	defer p.untrack(a, b)
	var wg sync.WaitGroup
	wg.Add(2)
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		io.Copy(dst, src)
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

// Close cuts every open tunnel and idle upstream connection; http.Server.Shutdown does not
// know hijacked connections.
func (p *Proxy) Close() {
	p.init()
	p.mu.Lock()
	p.closed = true
	for c := range p.tunnels {
		c.Close()
	}
	p.mu.Unlock()
	p.transport.CloseIdleConnections()
}

type outcome struct{ err error }

type outcomeKey struct{}

func outcomeOf(r *http.Request) *outcome { return r.Context().Value(outcomeKey{}).(*outcome) }

func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, dec adminclient.Decision) {
	out := &outcome{}
	p.forwarder.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), outcomeKey{}, out)))
	if out.err != nil {
		p.unreachable(w, dec, out.err)
		return
	}
	p.Recorder.Record(dec)
}

// dial connects to an allowed destination.
func (p *Proxy) dial(ctx context.Context, d allowlist.Dest) (net.Conn, error) {
	timeout := p.DialTimeout
	if timeout <= 0 {
		timeout = DefaultDialTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var dialer net.Dialer
	port := strconv.Itoa(d.Port)
	if d.Addr.IsValid() {
		return dialer.DialContext(ctx, "tcp", net.JoinHostPort(d.Addr.String(), port))
	}
	if a, ok := p.Hosts[d.Host]; ok {
		return dialer.DialContext(ctx, "tcp", net.JoinHostPort(a.String(), port))
	}
	resolver := p.Resolver
	if resolver == nil {
		resolver = net.DefaultResolver
	}
	addrs, err := resolver.LookupNetIP(ctx, "ip", d.Host)
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		if nonPublic(a.Unmap()) {
			return nil, fmt.Errorf("%s resolves to %s: %w", d.Host, a.Unmap(), errNonPublic)
		}
	}
	var firstErr error
	for _, a := range addrs {
		c, err := dialer.DialContext(ctx, "tcp", net.JoinHostPort(a.Unmap().String(), port))
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

func nonPublic(a netip.Addr) bool {
	return a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() || a.IsUnspecified() ||
		a.IsMulticast() || a.IsInterfaceLocalMulticast()
}

func clientIP(remoteAddr string) string {
	if ap, err := netip.ParseAddrPort(remoteAddr); err == nil {
		return ap.Addr().Unmap().String()
	}
	return remoteAddr
}
