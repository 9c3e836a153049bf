package egress

import (
	"encoding/json"
	"io"
	"net/netip"
	"sync"
	"time"

	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
)

// Recorder writes every decision as a JSON line and keeps the latest blocked ones per client in
// bounded memory: at most MaxClients clients (the least recently active is forgotten first) of
// at most PerClient decisions each (the oldest is overwritten first).
type Recorder struct {
	PerClient  int
	MaxClients int
	// Out receives one JSON line per decision (nil: none).
	Out io.Writer

	mu      sync.Mutex
	clients map[netip.Addr]*ring
}

// Defaults for a zero Recorder's bounds: 65536 blocked decisions, about 10 MiB of heap when
// full (measured with 200-character destinations).
const (
	DefaultPerClient  = 64
	DefaultMaxClients = 1024
)

// Longest method and destination text kept; longer ones are cut (they are refused anyway).
const (
	maxMethodLen = 16
	maxDestLen   = 270
)

type ring struct {
	buf  []adminclient.Decision
	next int // where the next decision goes
	full bool
	// lostUntil is the time of the newest decision overwritten so far.
	lostUntil time.Time
	last      time.Time
}

// Record logs d and, if it was blocked, keeps it for its client.
func (r *Recorder) Record(d adminclient.Decision) {
	d.Method = truncate(d.Method, maxMethodLen)
	d.Dest = truncate(d.Dest, maxDestLen)
	line, _ := json.Marshal(d)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.Out != nil {
		r.Out.Write(append(line, '\n')) // a failing log sink must not stop the proxy
	}
	if d.Allowed {
		return
	}
	addr, err := netip.ParseAddr(d.Client)
	if err != nil {
		return
	}
	addr = addr.Unmap()
	if r.clients == nil {
		r.clients = map[netip.Addr]*ring{}
	}
	c := r.clients[addr]
	if c == nil {
		r.evictLocked()
		c = &ring{buf: make([]adminclient.Decision, 0, r.perClient())}
		r.clients[addr] = c
	}
	c.add(d)
}

func (r *Recorder) perClient() int {
	if r.PerClient > 0 {
		return r.PerClient
	}
	return DefaultPerClient
}

func (r *Recorder) maxClients() int {
	if r.MaxClients > 0 {
		return r.MaxClients
	}
	return DefaultMaxClients
}

// evictLocked makes room for one more client.
func (r *Recorder) evictLocked() {
	for len(r.clients) >= r.maxClients() {
		var oldest netip.Addr
		var at time.Time
		for a, c := range r.clients {
			if !oldest.IsValid() || c.last.Before(at) {
				oldest, at = a, c.last
			}
		}
		delete(r.clients, oldest)
	}
}

func (c *ring) add(d adminclient.Decision) {
	if len(c.buf) < cap(c.buf) {
		c.buf = append(c.buf, d)
	} else {
		if old := c.buf[c.next]; old.Time.After(c.lostUntil) {
			c.lostUntil = old.Time
		}
		c.buf[c.next] = d
		c.full = true
	}
	c.next = (c.next + 1) % cap(c.buf)
	if d.Time.After(c.last) {
		c.last = d.Time
	}
}

// Blocked lists the client's blocked attempts at or after since, oldest first.
func (r *Recorder) Blocked(client netip.Addr, since time.Time) adminclient.Blocked {
	client = client.Unmap()
	out := adminclient.Blocked{Client: client.String(), Blocked: []adminclient.Decision{}}
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.clients[client]
	if c == nil {
		return out
	}
	start := 0
	if c.full {
		start = c.next
	}
	for i := 0; i < len(c.buf); i++ {
		if d := c.buf[(start+i)%len(c.buf)]; !d.Time.Before(since) {
			out.Blocked = append(out.Blocked, d)
		}
	}
	out.Truncated = !c.lostUntil.IsZero() && !c.lostUntil.Before(since)
	return out
}

// clientCount is for tests of the memory bound.
func (r *Recorder) clientCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.clients)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

func truncateErr(err error) string { return truncate(err.Error(), 300) }
