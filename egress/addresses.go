package egress

import "net/netip"

// reach is what a resolved address may be, for a name the allowlist allows.
type reach int

const (
	public  reach = iota
	private       // RFC 1918, CGNAT, ULA, local-use NAT64: only the job's instance, or a rule naming it
	never         // loopback, link-local (cloud metadata), multicast, reserved: only a rule naming it
)

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

var (
	// privateNetworks are those that netip.Addr.IsPrivate does not know.
	privateNetworks = prefixes("100.64.0.0/10", "64:ff9b:1::/48")
	// reservedNetworks are neither the internet's nor a site's: "this network", IETF protocol
	// assignments, documentation, benchmarking, class E and broadcast, IPv4-compatible IPv6,
	// discard, Teredo and 6to4 (which tunnel to addresses of any kind), site-local.
	reservedNetworks = prefixes("0.0.0.0/8", "192.0.0.0/24", "192.0.2.0/24", "198.18.0.0/15", "198.51.100.0/24",
		"203.0.113.0/24", "240.0.0.0/4", "::/96", "100::/64", "2001::/32", "2001:db8::/32", "2002::/16", "fec0::/10")
	// nat64 is the well-known NAT64 prefix: its addresses are the IPv4 address in their last 32 bits.
	nat64 = netip.MustParsePrefix("64:ff9b::/96")
)

// reachOf classifies an address a name resolved to.
func reachOf(a netip.Addr) reach {
	a = a.Unmap()
	if nat64.Contains(a) {
		b := a.As16()
		return reachOf(netip.AddrFrom4([4]byte(b[12:])))
	}
	switch {
	case a.IsLoopback(), a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast(), a.IsInterfaceLocalMulticast(),
		a.IsMulticast(), a.IsUnspecified(), containedIn(reservedNetworks, a):
		return never
	case a.IsPrivate(), containedIn(privateNetworks, a):
		return private
	}
	return public
}

func containedIn(networks []netip.Prefix, a netip.Addr) bool {
	for _, p := range networks {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
