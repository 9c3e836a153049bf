package netfence

import (
	"bytes"
	"encoding/hex"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// goldenRules: loopback, the agent's replies from both its ports to the runners' network and one
// destination.
func goldenRules() []Rule {
	return OutputRules([]netip.Prefix{netip.MustParsePrefix("10.88.0.0/16")}, AgentReplyPorts, []Rule{{Dst: netip.MustParsePrefix("10.1.0.0/16"), Proto: TCP, DstPorts: Ports{443, 443}}})
}

func TestFilterTableLayout(t *testing.T) {
	entries, layout := ipv4.FilterTable(goldenRules(), true)
	// INPUT policy 152, FORWARD policy 152, OUTPUT: the witness's udp REJECT 152, -o lo 152, two
	// --sport 200 each, -d 200, the tcp REJECT 152, the DROP policy 152, then the ERROR entry 176.
	want := Layout{
		HookEntry:  [numHooks]uint32{hookLocalIn: 0, hookForward: 152, hookLocalOut: 304},
		Underflow:  [numHooks]uint32{hookLocalIn: 0, hookForward: 152, hookLocalOut: 1360},
		NumEntries: 10,
		Size:       1688,
	}
	if layout != want {
		t.Fatalf("layout = %+v, want %+v", layout, want)
	}
	if len(entries) != int(want.Size) {
		t.Fatalf("%d bytes of entries, layout says %d", len(entries), want.Size)
	}
	wantOffsets := []offsets{{0, 112, 152}, {152, 112, 152}, {304, 112, 152}, {456, 112, 152}, {608, 160, 200}, {808, 160, 200}, {1008, 160, 200}, {1208, 112, 152}, {1360, 112, 152}, {1512, 112, 176}}
	checkOffsets(t, entries, ipv4, wantOffsets)

	verdict := func(at int) int32 { return int32(le.Uint32(entries[at+extensionDataAt:])) }
	for _, at := range []int{0 + 112, 456 + 112, 608 + 160, 808 + 160, 1008 + 160} {
		if v := verdict(at); v != verdictAccept {
			t.Errorf("verdict at %d = %d, want ACCEPT (%d)", at, v, verdictAccept)
		}
	}
	for _, at := range []int{152 + 112, 1360 + 112} {
		if v := verdict(at); v != verdictDrop {
			t.Errorf("FORWARD and OUTPUT policy verdict at %d = %d, want DROP (%d)", at, v, verdictDrop)
		}
	}
	// The witness first, ahead of loopback: udp, REJECT --reject-with icmp-port-unreachable
	// (IPT_ICMP_PORT_UNREACHABLE, 3); every other tcp last: REJECT --reject-with tcp-reset
	// (IPT_TCP_RESET, 7). Neither has a port match.
	for _, r := range []struct {
		at    int
		proto Proto
		with  uint32
	}{{304, UDP, 3}, {1208, TCP, 7}} {
		e := entries[r.at:]
		target := e[ipv4.entrySize:]
		if proto, size, name, with := le.Uint16(e[ipv4.protoAt:]), le.Uint16(target), string(target[extensionNameAt:extensionNameAt+7]), le.Uint32(target[extensionDataAt:]); proto != uint16(r.proto) || size != rejectTargetSize || name != "REJECT\x00" || with != r.with {
			t.Errorf("entry at %d: protocol %d, target size %d, name %q, with %d; want %s, REJECT with %d", r.at, proto, size, name, with, r.proto, r.with)
		}
	}
	if addr, mask := entries[304+ipv4.dstAt:304+ipv4.dstAt+4], entries[304+ipv4.dstMaskAt:304+ipv4.dstMaskAt+4]; !bytes.Equal(addr, []byte{127, 0, 75, 44}) || !bytes.Equal(mask, []byte{255, 255, 255, 255}) {
		t.Errorf("the witness: -d % x mask % x, want 127.0.75.44/32", addr, mask)
	}
	if anywhere := entries[1208+ipv4.dstMaskAt : 1208+ipv4.dstMaskAt+4]; !bytes.Equal(anywhere, []byte{0, 0, 0, 0}) {
		t.Errorf("the last tcp REJECT has destination mask % x, want any", anywhere)
	}

	lo := entries[456:]
	if name, mask := lo[ipv4.outIfAt:ipv4.outIfAt+4], lo[ipv4.outIfMaskAt:ipv4.outIfMaskAt+4]; !bytes.Equal(name, []byte("lo\x00\x00")) || !bytes.Equal(mask, []byte{0xff, 0xff, 0xff, 0}) {
		t.Errorf("-o lo: name % x, mask % x", name, mask)
	}
	sport := entries[608:]
	if proto := le.Uint16(sport[ipv4.protoAt:]); proto != uint16(TCP) {
		t.Errorf("--sport rule protocol %d, want tcp", proto)
	}
	match := sport[ipv4.entrySize:]
	if size, name := le.Uint16(match), string(match[extensionNameAt:extensionNameAt+4]); size != portMatchSize || name != "tcp\x00" {
		t.Errorf("--sport match: size %d name %q", size, name)
	}
	if ports := match[extensionDataAt : extensionDataAt+8]; !bytes.Equal(ports, []byte{0x77, 0x1d, 0x77, 0x1d, 0, 0, 0xff, 0xff}) {
		t.Errorf("--sport 7543 ports % x", ports)
	}
	if addr, mask := sport[ipv4.dstAt:ipv4.dstAt+4], sport[ipv4.dstMaskAt:ipv4.dstMaskAt+4]; !bytes.Equal(addr, []byte{10, 88, 0, 0}) || !bytes.Equal(mask, []byte{255, 255, 0, 0}) {
		t.Errorf("--sport 7543 -d 10.88.0.0/16: address % x, mask % x", addr, mask)
	}
	dst := entries[1008:]
	if addr, mask := dst[ipv4.dstAt:ipv4.dstAt+4], dst[ipv4.dstMaskAt:ipv4.dstMaskAt+4]; !bytes.Equal(addr, []byte{10, 1, 0, 0}) || !bytes.Equal(mask, []byte{255, 255, 0, 0}) {
		t.Errorf("-d 10.1.0.0/16: address % x, mask % x", addr, mask)
	}
	if ports := dst[ipv4.entrySize+extensionDataAt : ipv4.entrySize+extensionDataAt+8]; !bytes.Equal(ports, []byte{0, 0, 0xff, 0xff, 0xbb, 1, 0xbb, 1}) {
		t.Errorf("--dport 443 ports % x", ports)
	}
	errorEntry := entries[1512+112:]
	if size, name, errName := le.Uint16(errorEntry), string(errorEntry[extensionNameAt:extensionNameAt+6]), string(errorEntry[extensionDataAt:extensionDataAt+6]); size != errorTargetSize || name != "ERROR\x00" || errName != "ERROR\x00" {
		t.Errorf("last entry: target size %d, name %q, error %q", size, name, errName)
	}
}

// A runtime without the REJECT target gets the same table that drops: the witness's rule drops,
// and the tcp REJECT is left out for the DROP policy.
func TestFilterTableWithoutRejectDrops(t *testing.T) {
	entries, layout := ipv4.FilterTable(goldenRules(), false)
	want := Layout{
		HookEntry:  [numHooks]uint32{hookLocalIn: 0, hookForward: 152, hookLocalOut: 304},
		Underflow:  [numHooks]uint32{hookLocalIn: 0, hookForward: 152, hookLocalOut: 1208},
		NumEntries: 9,
		Size:       1536,
	}
	if layout != want || len(entries) != int(want.Size) {
		t.Fatalf("layout = %+v (%d bytes), want %+v", layout, len(entries), want)
	}
	checkOffsets(t, entries, ipv4, []offsets{{0, 112, 152}, {152, 112, 152}, {304, 112, 152}, {456, 112, 152}, {608, 160, 200}, {808, 160, 200}, {1008, 160, 200}, {1208, 112, 152}, {1360, 112, 176}})
	if v, proto := int32(le.Uint32(entries[304+112+extensionDataAt:])), le.Uint16(entries[304+ipv4.protoAt:]); v != verdictDrop || proto != uint16(UDP) || !bytes.Equal(entries[304+ipv4.dstAt:304+ipv4.dstAt+4], []byte{127, 0, 75, 44}) {
		t.Errorf("the witness's verdict %d, protocol %d; want DROP (%d) of udp to 127.0.75.44", v, proto, verdictDrop)
	}
	if bytes.Contains(entries, []byte("REJECT")) {
		t.Error("a table without REJECT names it")
	}
}

type offsets struct{ at, target, next int }

// checkOffsets walks the entries by next_offset and compares each entry's offset,
// target_offset and next_offset, all 8-byte aligned.
func checkOffsets(t *testing.T, entries []byte, f family, want []offsets) {
	t.Helper()
	var got []offsets
	for at := 0; at < len(entries); {
		e := entries[at:]
		o := offsets{at, int(le.Uint16(e[f.targetOffsetAt:])), int(le.Uint16(e[f.nextOffsetAt:]))}
		if at%8 != 0 || o.target%8 != 0 || o.next%8 != 0 {
			t.Errorf("entry at %d is not 8-byte aligned: %+v", at, o)
		}
		if o.next == 0 {
			t.Fatalf("entry at %d has next_offset 0", at)
		}
		got = append(got, o)
		at += o.next
	}
	if !slices.Equal(got, want) {
		t.Errorf("entries = %+v\nwant      %+v", got, want)
	}
}

func TestFilterTableIPv6Layout(t *testing.T) {
	replyTo := []netip.Prefix{netip.MustParsePrefix("10.88.0.0/16"), netip.MustParsePrefix("fd00:88::/64")}
	rules := OutputRules(replyTo, AgentReplyPorts, []Rule{
		{Dst: netip.MustParsePrefix("10.1.0.0/16"), Proto: TCP, DstPorts: Ports{443, 443}},
		{Dst: netip.MustParsePrefix("2001:db8::/32"), Proto: UDP, DstPorts: Ports{53, 53}},
	})
	entries, layout := ipv6.FilterTable(rules, true)
	// ip6t_entry is 168 bytes: policies 208, no witness (an IPv4 address), -o lo 208, two
	// --sport 256 (to the IPv6 network), the IPv6 -d 256 (the IPv4 rules are left out), two
	// ICMPv6 rules for neighbour discovery 208, the tcp REJECT 208, DROP 208, ERROR 232.
	want := Layout{
		HookEntry:  [numHooks]uint32{hookLocalIn: 0, hookForward: 208, hookLocalOut: 416},
		Underflow:  [numHooks]uint32{hookLocalIn: 0, hookForward: 208, hookLocalOut: 2016},
		NumEntries: 11,
		Size:       2456,
	}
	if layout != want || len(entries) != int(want.Size) {
		t.Fatalf("layout = %+v (%d bytes), want %+v", layout, len(entries), want)
	}
	checkOffsets(t, entries, ipv6, []offsets{{0, 168, 208}, {208, 168, 208}, {416, 168, 208}, {624, 216, 256}, {880, 216, 256}, {1136, 216, 256}, {1392, 168, 208}, {1600, 168, 208}, {1808, 168, 208}, {2016, 168, 208}, {2224, 168, 232}})
	sport := entries[624:]
	if proto, flags := le.Uint16(sport[ipv6.protoAt:]), sport[ipv6.flagsAt]; proto != uint16(TCP) || flags != 0x01 {
		t.Errorf("--sport rule: protocol %d, flags %#x; want tcp and IP6T_F_PROTO", proto, flags)
	}
	dst := entries[1136:]
	wantDst := []byte{0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	wantMask := []byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	if addr, mask := dst[ipv6.dstAt:ipv6.dstAt+16], dst[ipv6.dstMaskAt:ipv6.dstMaskAt+16]; !bytes.Equal(addr, wantDst) || !bytes.Equal(mask, wantMask) {
		t.Errorf("-d 2001:db8::/32: address % x, mask % x", addr, mask)
	}
	if name := string(dst[ipv6.entrySize+extensionNameAt : ipv6.entrySize+extensionNameAt+4]); name != "udp\x00" {
		t.Errorf("-d rule's match %q, want udp", name)
	}
	if icmp := entries[1392:]; icmp[ipv6.protoAt] != byte(ICMPv6) || le.Uint16(icmp[ipv6.targetOffsetAt:]) != uint16(ipv6.entrySize) {
		t.Errorf("neighbour discovery rule: protocol %d, target_offset %d; want ICMPv6 and no match", icmp[ipv6.protoAt], le.Uint16(icmp[ipv6.targetOffsetAt:]))
	}
	// ip6tables' REJECT --reject-with tcp-reset is IP6T_TCP_RESET, 6, and needs IP6T_F_PROTO.
	reject := entries[1808:]
	target := reject[ipv6.entrySize:]
	if proto, flags, name, with := le.Uint16(reject[ipv6.protoAt:]), reject[ipv6.flagsAt], string(target[extensionNameAt:extensionNameAt+7]), le.Uint32(target[extensionDataAt:]); proto != uint16(TCP) || flags != 0x01 || name != "REJECT\x00" || with != 6 {
		t.Errorf("the tcp REJECT: protocol %d, flags %#x, target %q with %d; want tcp, IP6T_F_PROTO, REJECT tcp-reset (6)", proto, flags, name, with)
	}
}

func TestReplaceRequestGolden(t *testing.T) {
	entries, layout := ipv4.FilterTable(goldenRules(), true)
	req := ReplaceRequest(entries, layout, 3)
	if got := le.Uint32(req[replaceValidHooksAt:]); got != 0b01110 {
		t.Errorf("valid_hooks = %#x, want INPUT|FORWARD|OUTPUT", got)
	}
	if got := le.Uint32(req[replaceNumCountersAt:]); got != 3 {
		t.Errorf("num_counters = %d, want the old table's 3 entries", got)
	}
	if !bytes.Equal(req[replaceSize:], entries) {
		t.Error("the entries do not follow struct ipt_replace")
	}
	golden := filepath.Join("testdata", "replace.golden")
	dump := []byte(hex.Dump(req))
	if *update {
		if err := os.WriteFile(golden, dump, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (go test ./agent/netfence/ -run Golden -update writes it)", err)
	}
	if !bytes.Equal(dump, want) {
		t.Errorf("IPT_SO_SET_REPLACE request differs from %s:\n%s", golden, dump)
	}
}

func TestLayoutSameChainsIgnoresHooksTheFilterTableLacks(t *testing.T) {
	_, written := ipv4.FilterTable(goldenRules(), true)
	readBack := written
	readBack.HookEntry[0], readBack.Underflow[4] = 0xffffffff, 0xffffffff
	if !written.SameChains(readBack) {
		t.Error("PREROUTING and POSTROUTING differ only: the same chains")
	}
	readBack.Underflow[hookLocalOut] += 8
	if written.SameChains(readBack) {
		t.Error("a moved OUTPUT policy is not the same chains")
	}
}
