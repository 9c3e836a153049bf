package netfence

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// The netfilter ABI (linux/netfilter_ipv4/ip_tables.h, linux/netfilter_ipv6/ip6_tables.h,
// linux/netfilter/x_tables.h) as laid out on the 64-bit little-endian Linux the agent runs on
// (amd64, arm64). gVisor's netstack parses the same structures (pkg/abi/linux/netfilter*.go).
// ipt_replace and ipt_getinfo are ip6t_replace and ip6t_getinfo; the families differ in
// struct ipt_entry and ip6t_entry (family below).
const (
	// struct ipt_replace: name[32], valid_hooks, num_entries, size, hook_entry[5],
	// underflow[5], num_counters, then the user pointer to the old counters (8-aligned).
	replaceSize                = 96
	replaceValidHooksAt        = 32
	replaceNumEntriesAt        = 36
	replaceSizeAt              = 40
	replaceHookEntryAt         = 44
	replaceUnderflowAt         = 64
	replaceNumCountersAt       = 84
	replaceCountersPtrAt       = 88
	countersSize               = 16 // struct xt_counters: pcnt, bcnt
	interfaceNameSize          = 16
	getInfoSize                = 84 // struct ipt_getinfo: name[32], valid_hooks, hook_entry[5], underflow[5], num_entries, size
	getInfoValidHooksAt        = 32
	getInfoHookEntryAt         = 36
	getInfoUnderflowAt         = 56
	getInfoNumEntriesAt        = 76
	getInfoSizeAt              = 80
	matchHeaderSize            = 32 // struct xt_entry_match: match_size, name[29], revision
	portMatchSize              = matchHeaderSize + 16
	standardTargetSize         = 40 // xt_entry_target (32: target_size, name[29], revision) + int verdict, padded to 8
	rejectTargetSize           = 40 // xt_entry_target + struct ipt_reject_info or ip6t_reject_info (enum with), padded to 8
	errorTargetSize            = 64 // xt_entry_target + char errorname[30], padded to 8
	extensionNameAt            = 2  // the name in xt_entry_match and xt_entry_target
	extensionDataAt            = 32 // a match's data, a standard target's verdict, an error's name
	hookLocalIn                = 1  // NF_INET_LOCAL_IN
	hookForward                = 2  // NF_INET_FORWARD
	hookLocalOut               = 3  // NF_INET_LOCAL_OUT
	numHooks                   = 5  // NF_INET_NUMHOOKS
	filterValidHooks           = 1<<hookLocalIn | 1<<hookForward | 1<<hookLocalOut
	verdictDrop          int32 = -1 // -NF_DROP - 1
	verdictAccept        int32 = -2 // -NF_ACCEPT - 1
)

// family is where one address family's entry (struct ipt_entry or ip6t_entry, which begin with
// struct ipt_ip or ip6t_ip6) keeps the fields a rule sets.
type family struct {
	name                 string // for messages: "IPv4", "IPv6"
	tool                 string // its iptables, for messages in iptables' words
	is4                  bool   // the family of a rule's Dst
	entrySize            int
	targetOffsetAt       int
	nextOffsetAt         int
	dstAt, dstMaskAt     int
	outIfAt, outIfMaskAt int
	protoAt              int
	flagsAt              int
	protoFlag            byte // ip6tables matches the protocol only with IP6T_F_PROTO set
	domain, level, opt   int  // the raw socket's family and the sockopt level and names
	// tcpReset is REJECT's --reject-with tcp-reset: IPT_TCP_RESET, IP6T_TCP_RESET
	// (linux/netfilter_ipv4/ipt_REJECT.h, linux/netfilter_ipv6/ip6t_REJECT.h).
	tcpReset uint32
	// witness is the fence check's witness address (Witness) in this family, if it has one.
	witness netip.Prefix
}

// ipt_REJECT's --reject-with icmp-port-unreachable (IPT_ICMP_PORT_UNREACHABLE), what the IPv4
// witness rule answers.
const iptICMPPortUnreachable = 3

var (
	// struct ipt_entry: ipt_ip (src, dst, smsk, dmsk, iniface[16], outiface[16],
	// iniface_mask[16], outiface_mask[16], proto u16, flags, invflags: 84), nfcache,
	// target_offset, next_offset, comefrom, counters (8-aligned): 112.
	ipv4 = family{name: "IPv4", tool: "iptables", is4: true, entrySize: 112, targetOffsetAt: 88, nextOffsetAt: 90,
		dstAt: 4, dstMaskAt: 12, outIfAt: 32, outIfMaskAt: 64, protoAt: 80, flagsAt: 82,
		domain: 2 /* AF_INET */, level: 0 /* SOL_IP */, opt: 64, /* IPT_SO_GET_INFO, IPT_SO_SET_REPLACE */
		tcpReset: 7, witness: netip.PrefixFrom(Witness, 32)}
	// struct ip6t_entry: ip6t_ip6 (src, dst, smsk, dmsk of 16 bytes, the four interface
	// fields, proto u16, tos, flags, invflags: 136), nfcache, target_offset, next_offset,
	// comefrom, counters: 168.
	ipv6 = family{name: "IPv6", tool: "ip6tables", entrySize: 168, targetOffsetAt: 140, nextOffsetAt: 142,
		dstAt: 16, dstMaskAt: 48, outIfAt: 80, outIfMaskAt: 112, protoAt: 128, flagsAt: 131, protoFlag: 0x01, /* IP6T_F_PROTO */
		domain: 10 /* AF_INET6 */, level: 41 /* SOL_IPV6 */, opt: 64, /* IP6T_SO_GET_INFO, IP6T_SO_SET_REPLACE */
		tcpReset: 6}
)

// Proto is an IP protocol number a rule matches; zero matches every protocol.
type Proto uint8

// The protocols a rule can name. gVisor's netstack has port matches for TCP and UDP only.
const (
	TCP    Proto = 6
	UDP    Proto = 17
	ICMPv6 Proto = 58
)

func (p Proto) String() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	case ICMPv6:
		return "ipv6-icmp"
	}
	return "any"
}

// Ports is an inclusive port range; the zero value is every port.
type Ports struct{ First, Last uint16 }

// Any reports whether r matches every port.
func (r Ports) Any() bool { return r.First == 0 && (r.Last == 0 || r.Last == 65535) }

// Witness is the fence check's witness: a loopback address to which the IPv4 table refuses UDP
// (icmp-port-unreachable; it drops it in a table without REJECT) ahead of the rule that accepts
// loopback. The agent's fence check listens there on UDP and sends itself a datagram from
// 127.0.0.1: loopback traffic never leaves the sandbox and a socket is bound there, so a refusal
// (or silence) can come from this table alone, and the datagram's arrival proves it is not in
// place (wire.FenceNetstackEnv). UDP, not TCP: gVisor sends no reset for loopback TCP (its
// loopback leaves TCP checksums to an offload that REJECT's checksum check does not trust).
var Witness = netip.MustParseAddr("127.0.75.44")

// Rule is one ACCEPT rule of the OUTPUT chain. Its fields are all netstack can match: the output
// interface, the destination, the protocol and its ports.
type Rule struct {
	OutInterface string       // "-o lo"; empty matches every interface
	Dst          netip.Prefix // "-d"; the zero Prefix matches every destination
	Proto        Proto        // "-p"; required by SrcPorts and DstPorts
	SrcPorts     Ports        // "--sport"
	DstPorts     Ports        // "--dport"
}

func (r Rule) hasPortMatch() bool { return !r.SrcPorts.Any() || !r.DstPorts.Any() }

// Layout is where the filter table's chains begin and end inside its entries, as
// IPT_SO_SET_REPLACE wants it and IPT_SO_GET_INFO reports it.
type Layout struct {
	HookEntry, Underflow [numHooks]uint32
	NumEntries, Size     uint32
}

// SameChains reports whether l and o have the same entries and the same chains: the hooks a
// filter table does not have are left out (Linux reads them back as 0xffffffff, written as 0).
func (l Layout) SameChains(o Layout) bool {
	for hook := range numHooks {
		if filterValidHooks&(1<<hook) != 0 && (l.HookEntry[hook] != o.HookEntry[hook] || l.Underflow[hook] != o.Underflow[hook]) {
			return false
		}
	}
	return l.NumEntries == o.NumEntries && l.Size == o.Size
}

var le = binary.LittleEndian

// FilterTable encodes the filter table of family f that iptables-restore would write for
//
//	*filter
//	:INPUT ACCEPT
//	:FORWARD DROP
//	:OUTPUT DROP
//	-A OUTPUT -d 127.0.75.44/32 -p udp -j REJECT --reject-with icmp-port-unreachable   (IPv4: the Witness)
//	-A OUTPUT <each of output of family f> -j ACCEPT
//	-A OUTPUT -p tcp -j REJECT --reject-with tcp-reset
//	COMMIT
//
// and returns its entries and their layout; a rule for the other family's destinations is left
// out. Without refuse (a runtime that has no REJECT target), the witness rule is -j DROP and the
// last rule is left out: everything not accepted is dropped.
//
// TCP is refused with a reset, never an ICMP error: gVisor's netstack delivers the ICMP error of
// a REJECT in OUTPUT synchronously, into the socket that sent the packet, and a TCP connect that
// meets icmp-port-unreachable there deadlocks on its own endpoint's lock (160fafc42237;
// docs/security.md#the-netstack-fence). Its UDP sends release that lock first, which is what
// the witness's ICMP error relies on. Other UDP, and everything else, is dropped.
func (f family) FilterTable(output []Rule, refuse bool) ([]byte, Layout) {
	var (
		buf    []byte
		layout Layout
	)
	add := func(entry []byte) uint32 {
		at := uint32(len(buf))
		buf = append(buf, entry...)
		layout.NumEntries++
		return at
	}
	policy := func(hook int, verdict int32) {
		at := add(f.entry(Rule{}, standardTarget(verdict)))
		layout.HookEntry[hook], layout.Underflow[hook] = at, at
	}
	witness := standardTarget(verdictDrop)
	if refuse {
		witness = rejectTarget(iptICMPPortUnreachable)
	}
	policy(hookLocalIn, verdictAccept)
	policy(hookForward, verdictDrop)
	layout.HookEntry[hookLocalOut] = uint32(len(buf))
	if f.witness.IsValid() {
		add(f.entry(Rule{Dst: f.witness, Proto: UDP}, witness))
	}
	for _, r := range output {
		if !r.Dst.IsValid() || r.Dst.Addr().Is4() == f.is4 {
			add(f.entry(r, standardTarget(verdictAccept)))
		}
	}
	if refuse {
		add(f.entry(Rule{Proto: TCP}, rejectTarget(f.tcpReset)))
	}
	layout.Underflow[hookLocalOut] = add(f.entry(Rule{}, standardTarget(verdictDrop)))
	add(f.entry(Rule{}, errorTarget("ERROR")))
	layout.Size = uint32(len(buf))
	return buf, layout
}

// ReplaceRequest is the IPT_SO_SET_REPLACE argument for the filter table: struct ipt_replace and
// the entries. The pointer to the old counters (numCounters of them, what IPT_SO_GET_INFO
// reported) is left zero for the caller to set.
func ReplaceRequest(entries []byte, layout Layout, numCounters uint32) []byte {
	req := make([]byte, replaceSize, replaceSize+len(entries))
	copy(req, "filter")
	le.PutUint32(req[replaceValidHooksAt:], filterValidHooks)
	le.PutUint32(req[replaceNumEntriesAt:], layout.NumEntries)
	le.PutUint32(req[replaceSizeAt:], layout.Size)
	for hook := range numHooks {
		le.PutUint32(req[replaceHookEntryAt+4*hook:], layout.HookEntry[hook])
		le.PutUint32(req[replaceUnderflowAt+4*hook:], layout.Underflow[hook])
	}
	le.PutUint32(req[replaceNumCountersAt:], numCounters)
	return append(req, entries...)
}

// entry encodes f's struct ipt_entry or ip6t_entry for r, its port match if any, and target.
func (f family) entry(r Rule, target []byte) []byte {
	e := make([]byte, f.entrySize, f.entrySize+portMatchSize+len(target))
	if r.Dst.IsValid() {
		copy(e[f.dstAt:], r.Dst.Addr().AsSlice())
		copy(e[f.dstMaskAt:], net.CIDRMask(r.Dst.Bits(), r.Dst.Addr().BitLen()))
	}
	if r.OutInterface != "" {
		copy(e[f.outIfAt:f.outIfAt+interfaceNameSize], r.OutInterface)
		// iptables masks the name and its terminating NUL: an exact match, not a prefix.
		for i := range min(len(r.OutInterface)+1, interfaceNameSize) {
			e[f.outIfMaskAt+i] = 0xff
		}
	}
	if r.Proto != 0 {
		le.PutUint16(e[f.protoAt:], uint16(r.Proto))
		e[f.flagsAt] |= f.protoFlag
	}
	if r.hasPortMatch() {
		e = append(e, portMatch(r)...)
	}
	le.PutUint16(e[f.targetOffsetAt:], uint16(len(e)))
	e = append(e, target...)
	le.PutUint16(e[f.nextOffsetAt:], uint16(len(e)))
	return e
}

// portMatch encodes the "tcp" or "udp" match (xt_tcp, xt_udp: source then destination range,
// host order; no flags, options or inversions, which netstack refuses).
func portMatch(r Rule) []byte {
	m := make([]byte, portMatchSize)
	le.PutUint16(m, portMatchSize)
	copy(m[extensionNameAt:], r.Proto.String())
	for i, ports := range []Ports{r.SrcPorts, r.DstPorts} {
		first, last := ports.First, ports.Last
		if ports.Any() {
			first, last = 0, 65535
		}
		le.PutUint16(m[extensionDataAt+4*i:], first)
		le.PutUint16(m[extensionDataAt+4*i+2:], last)
	}
	return m
}

// standardTarget encodes xt_standard_target: the empty name and a verdict.
func standardTarget(verdict int32) []byte {
	t := make([]byte, standardTargetSize)
	le.PutUint16(t, standardTargetSize)
	le.PutUint32(t[extensionDataAt:], uint32(verdict))
	return t
}

// rejectTarget encodes the REJECT target (revision 0) with its reject_info: how to answer.
func rejectTarget(with uint32) []byte {
	t := make([]byte, rejectTargetSize)
	le.PutUint16(t, rejectTargetSize)
	copy(t[extensionNameAt:], "REJECT")
	le.PutUint32(t[extensionDataAt:], with)
	return t
}

// errorTarget encodes xt_error_target, which ends a table (and would start a user chain).
func errorTarget(name string) []byte {
	t := make([]byte, errorTargetSize)
	le.PutUint16(t, errorTargetSize)
	copy(t[extensionNameAt:], "ERROR")
	copy(t[extensionDataAt:], name)
	return t
}
