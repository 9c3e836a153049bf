package egress

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
	"github.com/sandbox-executor/sandbox-executor/egress/allowlist"
)

// MaxGrantRules bounds one grant: a job needs its instance, a wildcard and a registry or two.
const MaxGrantRules = 16

// DefaultMaxGrants bounds the clients with a grant (one per running job pod).
const DefaultMaxGrants = 4096

type clientGrant struct {
	instance  *allowlist.Allowlist // marked Private
	allowlist *allowlist.Allowlist
	until     time.Time
}

// Grants holds the per-client additions to the allowlist. The zero value is ready.
type Grants struct {
	// Max bounds the clients with a grant (0: DefaultMaxGrants).
	Max int

	mu     sync.Mutex
	grants map[netip.Addr]clientGrant
}

// Put replaces client's grant. It refuses a grant whose entries do not parse, that has too
// many, that has already lapsed at now, or that would exceed Max live grants.
func (g *Grants) Put(client netip.Addr, grant adminclient.Grant, now time.Time) error {
	if n := len(grant.Allow) + len(grant.Instance); n == 0 || n > MaxGrantRules {
		return fmt.Errorf("a grant has 1 to %d allowlist entries, not %d", MaxGrantRules, n)
	}
	if !grant.Until.After(now) {
		return fmt.Errorf("the grant's until (%s) is not in the future", grant.Until.UTC().Format(time.RFC3339))
	}
	rules, err := allowlist.ParseAllowlist(grant.Allow)
	if err != nil {
		return err
	}
	instance, err := allowlist.ParseAllowlist(grant.Instance)
	if err != nil {
		return fmt.Errorf("instance: %v", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.grants == nil {
		g.grants = map[netip.Addr]clientGrant{}
	}
	client = client.Unmap()
	if _, replacing := g.grants[client]; !replacing && len(g.grants) >= g.max() {
		g.dropLapsed(now)
		if len(g.grants) >= g.max() {
			return fmt.Errorf("%d clients already have a grant (the limit)", len(g.grants))
		}
	}
	g.grants[client] = clientGrant{instance: instance.Private(), allowlist: rules, until: grant.Until}
	return nil
}

// Delete removes client's grant, if any.
func (g *Grants) Delete(client netip.Addr) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.grants, client.Unmap())
}

// Match returns the rule of client's live grant that allows d.
func (g *Grants) Match(client netip.Addr, d allowlist.Dest, now time.Time) (allowlist.Rule, bool) {
	grant, ok := g.live(client, now)
	if !ok {
		return allowlist.Rule{}, false
	}
	if r, ok := grant.instance.Match(d); ok {
		return r, true
	}
	return grant.allowlist.Match(d)
}

// Addresses tells whether client's live grant names addr on port by an IP or network rule.
func (g *Grants) Addresses(client, addr netip.Addr, port int, now time.Time) bool {
	grant, ok := g.live(client, now)
	return ok && (grant.instance.Addresses(addr, port) || grant.allowlist.Addresses(addr, port))
}

// Live lists the grants in force at now, by client address.
func (g *Grants) Live(now time.Time) []adminclient.LiveGrant {
	if g == nil {
		return []adminclient.LiveGrant{}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	live := []adminclient.LiveGrant{}
	for client, grant := range g.grants {
		if now.Before(grant.until) {
			live = append(live, adminclient.LiveGrant{Client: client.String(), Until: grant.until})
		}
	}
	slices.SortFunc(live, func(a, b adminclient.LiveGrant) int { return strings.Compare(a.Client, b.Client) })
	return live
}

func (g *Grants) live(client netip.Addr, now time.Time) (clientGrant, bool) {
	if g == nil {
		return clientGrant{}, false
	}
	g.mu.Lock()
	grant, ok := g.grants[client.Unmap()]
	g.mu.Unlock()
	return grant, ok && now.Before(grant.until)
}

func (g *Grants) max() int {
	if g.Max > 0 {
		return g.Max
	}
	return DefaultMaxGrants
}

func (g *Grants) dropLapsed(now time.Time) {
	for c, grant := range g.grants {
		if !now.Before(grant.until) {
			delete(g.grants, c)
		}
	}
}
