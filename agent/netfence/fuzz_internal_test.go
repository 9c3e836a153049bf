package netfence

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
)

// FuzzParseAllow: an --allow that parses is one tcp or udp rule to a masked, zoneless, unmapped
// network on a port range within 1-65535, never an interface, source-port or ICMPv6 rule (those
// are the fence's own: loopback, the agent's replies, neighbour discovery); it prints back to a
// spec that parses to the same rule. A refusal is one line.
func FuzzParseAllow(f *testing.F) {
	// The seed corpus is testdata/fuzz/FuzzParseAllow.
	f.Fuzz(func(t *testing.T, spec string) {
		r, err := ParseAllow(spec)
		if err != nil {
			testutil.RequireOneLine(t, err, fmt.Sprintf("ParseAllow(%q)", spec))
			return
		}
		if r.Proto != TCP && r.Proto != UDP {
			t.Fatalf("ParseAllow(%q) = %+v: protocol %s", spec, r, r.Proto)
		}
		if r.OutInterface != "" || !r.SrcPorts.Any() {
			t.Fatalf("ParseAllow(%q) = %+v: an interface or source-port rule", spec, r)
		}
		if r.DstPorts.First == 0 || r.DstPorts.Last < r.DstPorts.First {
			t.Fatalf("ParseAllow(%q) = %+v: ports %d-%d", spec, r, r.DstPorts.First, r.DstPorts.Last)
		}
		checkPrefix(t, spec, r.Dst)
		again := r.Dst.String() + ":" + r.DstPorts.String() + "/" + r.Proto.String()
		if back, err := ParseAllow(again); err != nil || back != r {
			t.Fatalf("ParseAllow(%q) = %+v prints as %q, which parses to %+v, %v", spec, r, again, back, err)
		}
	})
}

// FuzzParseReplyPort: a --reply-port that parses is one of the agent's own ports
// (AgentReplyPorts), never a port a job could listen on, and its decimal parses back to it;
// each agent port's decimal parses. A refusal is one line.
func FuzzParseReplyPort(f *testing.F) {
	for _, s := range []string{"7543", "7544", "0", "22", "65535", "65536", "-7543", "+7543", "07543", "7543 ", "0x1d77", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		port, err := parseReplyPort(v)
		if err != nil {
			testutil.RequireOneLine(t, err, fmt.Sprintf("parseReplyPort(%q)", v))
			if n, convErr := strconv.ParseUint(v, 10, 16); convErr == nil && v == strconv.FormatUint(n, 10) && slices.Contains(AgentReplyPorts, uint16(n)) {
				t.Fatalf("parseReplyPort(%q) refused the agent's port %d: %v", v, n, err)
			}
			return
		}
		if !slices.Contains(AgentReplyPorts, port) {
			t.Fatalf("parseReplyPort(%q) = %d, not one of the agent's ports %v", v, port, AgentReplyPorts)
		}
		if back, err := parseReplyPort(strconv.Itoa(int(port))); err != nil || back != port {
			t.Fatalf("parseReplyPort(%q) = %d, whose decimal parses to %d, %v", v, port, back, err)
		}
	})
}

// FuzzParseDestination: a destination (--allow's, --reply-to's) that parses is a masked,
// zoneless network that is not IPv4-mapped, and its text parses back to it; a bare address is a
// network of one.
func FuzzParseDestination(f *testing.F) {
	for _, s := range []string{"10.0.0.0/8", "192.0.2.7", "[2001:db8::1]", "2001:db8::/32", "0.0.0.0/0", "::/0", "[::ffff:10.0.0.1]", "10.0.0.1/8", "[fe80::1%eth0]", "2001:db8::1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, dst string) {
		p, err := parseDestination(dst)
		if err != nil {
			testutil.RequireOneLine(t, err, fmt.Sprintf("parseDestination(%q)", dst))
			return
		}
		checkPrefix(t, dst, p)
		if back, err := parseDestination(p.String()); err != nil || back != p {
			t.Fatalf("parseDestination(%q) = %s, which parses to %s, %v", dst, p, back, err)
		}
		if a, err := netip.ParseAddr(strings.Trim(dst, "[]")); err == nil && (p.Addr() != a || p.Bits() != a.BitLen()) {
			t.Fatalf("parseDestination(%q) = %s: the address is not a network of one", dst, p)
		}
		if r, err := parseReplyTo(dst); p.Bits() == 0 && err == nil || p.Bits() > 0 && (err != nil || r != p) {
			t.Fatalf("parseReplyTo(%q) = %s, %v; parseDestination gave %s", dst, r, err, p)
		}
	})
}

func checkPrefix(t *testing.T, in string, p netip.Prefix) {
	t.Helper()
	if !p.IsValid() || p.Masked() != p || p.Addr().Zone() != "" || p.Addr().Is4In6() {
		t.Fatalf("%q gave %s: not a masked, zoneless, unmapped network", in, p)
	}
}

// FuzzReadNameservers: --allow-dns allows DNS to the nameservers of resolv.conf and nothing
// else: each server is a zoneless, unmapped address that a "nameserver" line of the file names,
// each gets exactly udp and tcp port 53; a file that names none is refused in one line.
func FuzzReadNameservers(f *testing.F) {
	f.Add([]byte("search ns.svc.cluster.local\nnameserver 10.96.0.10\nnameserver fd00::10\noptions ndots:5\n"))
	f.Add([]byte("nameserver ::ffff:10.0.0.1\nnameserver fe80::1%eth0\n"))
	f.Add([]byte("# nameserver 10.0.0.9\n nameserver\t10.0.0.8 extra\nnameserver10.0.0.7\n"))
	f.Add([]byte("search example\n"))
	path := filepath.Join(f.TempDir(), "resolv.conf") // one file per process: its runs take turns
	f.Fuzz(func(t *testing.T, conf []byte) {
		if err := os.WriteFile(path, conf, 0o644); err != nil {
			t.Fatal(err)
		}
		servers, err := readNameservers(path)
		if err != nil {
			testutil.RequireOneLine(t, err, fmt.Sprintf("readNameservers(%q)", conf))
			return
		}
		named := map[netip.Addr]bool{}
		for _, line := range strings.Split(string(conf), "\n") {
			if fields := strings.Fields(line); len(fields) >= 2 && fields[0] == "nameserver" {
				if a, err := netip.ParseAddr(fields[1]); err == nil {
					named[a.Unmap()] = true
				}
			}
		}
		if len(servers) == 0 {
			t.Fatalf("readNameservers(%q) = no server and no error", conf)
		}
		for _, s := range servers {
			if !s.IsValid() || s.Zone() != "" || s.Is4In6() || !named[s] {
				t.Fatalf("readNameservers(%q) gave %s: not a zoneless, unmapped address a nameserver line names", conf, s)
			}
		}
		rules := DNSRules(servers)
		if len(rules) != 2*len(servers) {
			t.Fatalf("DNSRules(%v) = %d rules", servers, len(rules))
		}
		for _, r := range rules {
			if r.DstPorts != (Ports{53, 53}) || r.Proto != UDP && r.Proto != TCP || !r.SrcPorts.Any() || r.OutInterface != "" ||
				r.Dst.Bits() != r.Dst.Addr().BitLen() || !named[r.Dst.Addr()] {
				t.Fatalf("DNSRules(%v) has %+v: not udp or tcp 53 to one of them", servers, r)
			}
		}
	})
}

// FuzzFilterTable: whatever the rules, each family's table is well formed (entries 8-aligned,
// their offsets inside them, one after another to the table's size, every hook and underflow at
// an entry, the last entry the ERROR target), INPUT's policy accepts and FORWARD's drops, and
// OUTPUT, read back as the kernel reads it, accepts exactly the family's rules in order (the
// others' family left out) and ends in a DROP policy, with the REJECT target or without: the
// encoding never accepts more than it was given. ReplaceRequest carries the layout.
func FuzzFilterTable(f *testing.F) {
	// Each rule is 28 bytes (fuzzRules): family (even: IPv4), address (16), prefix bits,
	// protocol, the first and last source port, the first and last destination port (big
	// endian), and an interface flag (odd: "lo").
	f.Add(bytes.Repeat([]byte{0}, 28))
	f.Add(append(append([]byte{0, 10, 0, 0, 0}, make([]byte, 12)...), 8, 6, 0, 0, 0, 0, 0x01, 0xbb, 0x01, 0xbb, 0))
	f.Add(append(append([]byte{1, 0x20, 0x01, 0x0d, 0xb8}, make([]byte, 12)...), 32, 17, 0x1d, 0x77, 0x1d, 0x77, 0, 0, 0, 0, 0))
	f.Add(append(append(append([]byte{0}, make([]byte, 16)...), 255, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1),
		append(append([]byte{1, 0xfe, 0x80}, make([]byte, 14)...), 10, 58, 0, 0, 0, 0, 0, 0, 0, 0, 0)...))
	f.Fuzz(func(t *testing.T, data []byte) {
		rules := fuzzRules(data)
		for _, tc := range []struct {
			fam    family
			refuse bool
		}{{ipv4, false}, {ipv4, true}, {ipv6, false}, {ipv6, true}} {
			fam := tc.fam
			entries, layout := fam.FilterTable(rules, tc.refuse)
			var want []Rule
			for _, r := range rules {
				if !r.Dst.IsValid() || r.Dst.Addr().Is4() == fam.is4 {
					want = append(want, r)
				}
			}
			checkTable(t, fam, entries, layout, want)
			req := ReplaceRequest(entries, layout, 7)
			if len(req) != replaceSize+len(entries) || string(bytes.TrimRight(req[:32], "\x00")) != "filter" ||
				le.Uint32(req[replaceValidHooksAt:]) != filterValidHooks || le.Uint32(req[replaceNumEntriesAt:]) != layout.NumEntries ||
				le.Uint32(req[replaceSizeAt:]) != layout.Size || le.Uint32(req[replaceNumCountersAt:]) != 7 ||
				le.Uint32(req[replaceHookEntryAt+4*hookLocalOut:]) != layout.HookEntry[hookLocalOut] ||
				le.Uint32(req[replaceUnderflowAt+4*hookLocalOut:]) != layout.Underflow[hookLocalOut] ||
				!bytes.Equal(req[replaceSize:], entries) {
				t.Fatalf("%s: ReplaceRequest does not carry the table and its layout %+v", fam.name, layout)
			}
		}
	})
}

// fuzzRules makes rules of what the fence can write: an optional interface, a masked network,
// a protocol, and port ranges only with tcp or udp.
func fuzzRules(data []byte) []Rule {
	var rules []Rule
	for ; len(data) >= 28 && len(rules) < 64; data = data[28:] {
		var r Rule
		var a netip.Addr
		if data[0]%2 == 0 {
			a = netip.AddrFrom4([4]byte(data[1:5]))
		} else {
			a = netip.AddrFrom16([16]byte(data[1:17]))
		}
		if bits := int(data[17]); bits <= a.BitLen() {
			r.Dst = netip.PrefixFrom(a, bits).Masked()
		} // else: every destination
		switch r.Proto = Proto(data[18]); r.Proto {
		case TCP, UDP:
			r.SrcPorts = Ports{be16(data[19:]), be16(data[21:])}
			r.DstPorts = Ports{be16(data[23:]), be16(data[25:])}
			if r.SrcPorts.Last < r.SrcPorts.First {
				r.SrcPorts = Ports{}
			}
			if r.DstPorts.Last < r.DstPorts.First {
				r.DstPorts = Ports{}
			}
		case ICMPv6, 0:
		default:
			r.Proto = 0
		}
		if data[27]%2 == 1 {
			r.OutInterface = "lo"
		}
		rules = append(rules, r)
	}
	return rules
}

func be16(b []byte) uint16 { return uint16(b[0])<<8 | uint16(b[1]) }

// tableEntry is one entry read back: where it starts, its rule, and its target.
type tableEntry struct {
	at      uint32
	rule    Rule
	target  string // "" for a standard target
	verdict int32
}

// checkTable reads entries back as the kernel walks them and checks them against want.
func checkTable(t *testing.T, fam family, entries []byte, layout Layout, want []Rule) {
	t.Helper()
	var read []tableEntry
	for at := 0; at < len(entries); {
		if at%8 != 0 || len(entries)-at < fam.entrySize {
			t.Fatalf("%s: an entry at %d of %d bytes", fam.name, at, len(entries))
		}
		e := entries[at:]
		targetAt, next := int(le.Uint16(e[fam.targetOffsetAt:])), int(le.Uint16(e[fam.nextOffsetAt:]))
		if targetAt < fam.entrySize || next < targetAt+standardTargetSize || next%8 != 0 || next > len(e) {
			t.Fatalf("%s: entry at %d has target offset %d, next offset %d", fam.name, at, targetAt, next)
		}
		got := tableEntry{at: uint32(at), rule: fam.readRule(t, e[:targetAt])}
		target := e[targetAt:next]
		if int(le.Uint16(target)) != len(target) {
			t.Fatalf("%s: entry at %d: target size %d of %d bytes", fam.name, at, le.Uint16(target), len(target))
		}
		got.target = string(bytes.TrimRight(target[extensionNameAt:extensionNameAt+29], "\x00"))
		if got.target == "" {
			got.verdict = int32(le.Uint32(target[extensionDataAt:]))
		}
		read = append(read, got)
		at += next
	}
	if uint32(len(read)) != layout.NumEntries || uint32(len(entries)) != layout.Size {
		t.Fatalf("%s: %d entries in %d bytes, layout says %d in %d", fam.name, len(read), len(entries), layout.NumEntries, layout.Size)
	}
	index := func(at uint32) int {
		i := slices.IndexFunc(read, func(e tableEntry) bool { return e.at == at })
		if i < 0 {
			t.Fatalf("%s: a hook or underflow at %d, where no entry starts", fam.name, at)
		}
		return i
	}
	policy := func(hook int, verdict int32) {
		if i, j := index(layout.HookEntry[hook]), index(layout.Underflow[hook]); i != j || read[i].rule != (Rule{}) || read[i].target != "" || read[i].verdict != verdict {
			t.Fatalf("%s: hook %d is not a policy of verdict %d alone: %+v", fam.name, hook, verdict, read[i])
		}
	}
	policy(hookLocalIn, verdictAccept)
	policy(hookForward, verdictDrop)
	out, end := index(layout.HookEntry[hookLocalOut]), index(layout.Underflow[hookLocalOut])
	if last := read[len(read)-1]; last.target != "ERROR" || end != len(read)-2 {
		t.Fatalf("%s: the table does not end with OUTPUT's policy and the ERROR target", fam.name)
	}
	if p := read[end]; p.rule != (Rule{}) || p.target != "" || p.verdict != verdictDrop {
		t.Fatalf("%s: OUTPUT's policy is %+v, not DROP", fam.name, p)
	}
	var accepted []Rule
	for _, e := range read[out:end] {
		if e.target == "" && e.verdict == verdictAccept {
			accepted = append(accepted, e.rule)
		}
	}
	for i := range want { // as the kernel reads it back
		w := &want[i]
		if w.Dst.Bits() == 0 {
			w.Dst = netip.Prefix{} // 0.0.0.0/0, ::/0: no address, no mask
		}
		for _, p := range []*Ports{&w.SrcPorts, &w.DstPorts} {
			if !w.hasPortMatch() {
				*p = Ports{}
			} else if p.Any() {
				*p = Ports{0, 65535}
			}
		}
	}
	if !slices.Equal(accepted, want) {
		t.Fatalf("%s: OUTPUT accepts\n%v\nwant\n%v", fam.name, accepted, want)
	}
}

// readRule reads an entry's match fields and its port match back into a rule.
func (f family) readRule(t *testing.T, e []byte) Rule {
	t.Helper()
	var r Rule
	n := 4
	if !f.is4 {
		n = 16
	}
	mask := e[f.dstMaskAt : f.dstMaskAt+n]
	if bits, size := net.IPMask(mask).Size(); size == 0 && !bytes.Equal(mask, make([]byte, n)) {
		t.Fatalf("%s: a mask %x that is not a prefix", f.name, mask)
	} else if bits > 0 || !bytes.Equal(e[f.dstAt:f.dstAt+n], make([]byte, n)) {
		a, _ := netip.AddrFromSlice(e[f.dstAt : f.dstAt+n])
		r.Dst = netip.PrefixFrom(a, bits)
		if r.Dst.Masked() != r.Dst {
			t.Fatalf("%s: destination %s has bits outside its mask", f.name, r.Dst)
		}
	}
	if name := e[f.outIfAt : f.outIfAt+interfaceNameSize]; name[0] != 0 {
		r.OutInterface = string(bytes.TrimRight(name, "\x00"))
	}
	r.Proto = Proto(le.Uint16(e[f.protoAt:]))
	if r.Proto != 0 && e[f.flagsAt]&f.protoFlag != f.protoFlag {
		t.Fatalf("%s: protocol %s without its flag", f.name, r.Proto)
	}
	if len(e) > f.entrySize {
		m := e[f.entrySize:]
		if len(m) != portMatchSize || int(le.Uint16(m)) != portMatchSize || string(bytes.TrimRight(m[extensionNameAt:extensionNameAt+29], "\x00")) != r.Proto.String() {
			t.Fatalf("%s: a match that is not %s's port match: %x", f.name, r.Proto, m)
		}
		r.SrcPorts = Ports{le.Uint16(m[extensionDataAt:]), le.Uint16(m[extensionDataAt+2:])}
		r.DstPorts = Ports{le.Uint16(m[extensionDataAt+4:]), le.Uint16(m[extensionDataAt+6:])}
	}
	return r
}
