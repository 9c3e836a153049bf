package netfence

import (
	"bytes"
	"encoding/hex"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// goldenRules: loopback, the agent's replies to the runners' network and one destination.
func goldenRules() []Rule {
	return OutputRules([]netip.Prefix{netip.MustParsePrefix("10.88.0.0/16")}, []Rule{{Dst: netip.MustParsePrefix("10.1.0.0/16"), Proto: TCP, DstPorts: Ports{443, 443}}})
}

func TestFilterTableLayout(t *testing.T) {
	entries, layout := ipv4.FilterTable(goldenRules())
	// INPUT policy 152, FORWARD policy 152, OUTPUT: -o lo 152, two --sport 200 each, -d 200,
	// the DROP policy 152, then the ERROR entry 176.
	want := Layout{
		HookEntry:  [numHooks]uint32{hookLocalIn: 0, hookForward: 152, hookLocalOut: 304},
		Underflow:  [numHooks]uint32{hookLocalIn: 0, hookForward: 152, hookLocalOut: 1056},
		NumEntries: 8,
		Size:       1384,
	}
	if layout != want {
		t.Fatalf("layout = %+v, want %+v", layout, want)
	}
	if len(entries) != int(want.Size) {
		t.Fatalf("%d bytes of entries, layout says %d", len(entries), want.Size)
	}
	type offsets struct{ at, target, next int }
	var got []offsets
	for at := 0; at < len(entries); {
		e := entries[at:]
		o := offsets{at, int(le.Uint16(e[ipv4.targetOffsetAt:])), int(le.Uint16(e[ipv4.nextOffsetAt:]))}
		if at%8 != 0 || o.target%8 != 0 || o.next%8 != 0 {
			t.Errorf("entry at %d is not 8-byte aligned: %+v", at, o)
		}
		got = append(got, o)
		at += o.next
	}
	wantOffsets := []offsets{{0, 112, 152}, {152, 112, 152}, {304, 112, 152}, {456, 160, 200}, {656, 160, 200}, {856, 160, 200}, {1056, 112, 152}, {1208, 112, 176}}
	if len(got) != len(wantOffsets) {
		t.Fatalf("entries = %+v, want %+v", got, wantOffsets)
	}
	for i := range got {
		if got[i] != wantOffsets[i] {
			t.Errorf("entry %d = %+v, want %+v", i, got[i], wantOffsets[i])
		}
	}

	verdict := func(at int) int32 { return int32(le.Uint32(entries[at+extensionDataAt:])) }
	for _, at := range []int{0 + 112, 304 + 112, 456 + 160, 656 + 160, 856 + 160} {
		if v := verdict(at); v != verdictAccept {
			t.Errorf("verdict at %d = %d, want ACCEPT (%d)", at, v, verdictAccept)
		}
	}
	for _, at := range []int{152 + 112, 1056 + 112} {
		if v := verdict(at); v != verdictDrop {
			t.Errorf("FORWARD and OUTPUT policy verdict at %d = %d, want DROP (%d)", at, v, verdictDrop)
		}
	}

	lo := entries[304:]
	if name, mask := lo[ipv4.outIfAt:ipv4.outIfAt+4], lo[ipv4.outIfMaskAt:ipv4.outIfMaskAt+4]; !bytes.Equal(name, []byte("lo\x00\x00")) || !bytes.Equal(mask, []byte{0xff, 0xff, 0xff, 0}) {
		t.Errorf("-o lo: name % x, mask % x", name, mask)
	}
	sport := entries[456:]
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
	dst := entries[856:]
	if addr, mask := dst[ipv4.dstAt:ipv4.dstAt+4], dst[ipv4.dstMaskAt:ipv4.dstMaskAt+4]; !bytes.Equal(addr, []byte{10, 1, 0, 0}) || !bytes.Equal(mask, []byte{255, 255, 0, 0}) {
		t.Errorf("-d 10.1.0.0/16: address % x, mask % x", addr, mask)
	}
	if ports := dst[ipv4.entrySize+extensionDataAt : ipv4.entrySize+extensionDataAt+8]; !bytes.Equal(ports, []byte{0, 0, 0xff, 0xff, 0xbb, 1, 0xbb, 1}) {
		t.Errorf("--dport 443 ports % x", ports)
	}
	errorEntry := entries[1208+112:]
	if size, name, errName := le.Uint16(errorEntry), string(errorEntry[extensionNameAt:extensionNameAt+6]), string(errorEntry[extensionDataAt:extensionDataAt+6]); size != errorTargetSize || name != "ERROR\x00" || errName != "ERROR\x00" {
		t.Errorf("last entry: target size %d, name %q, error %q", size, name, errName)
	}
}

func TestFilterTableIPv6Layout(t *testing.T) {
	replyTo := []netip.Prefix{netip.MustParsePrefix("10.88.0.0/16"), netip.MustParsePrefix("fd00:88::/64")}
	rules := OutputRules(replyTo, []Rule{
		{Dst: netip.MustParsePrefix("10.1.0.0/16"), Proto: TCP, DstPorts: Ports{443, 443}},
		{Dst: netip.MustParsePrefix("2001:db8::/32"), Proto: UDP, DstPorts: Ports{53, 53}},
	})
	entries, layout := ipv6.FilterTable(rules)
	// ip6t_entry is 168 bytes: policies 208, -o lo 208, two --sport 256 (to the IPv6 network),
	// the IPv6 -d 256 (the IPv4 rules are left out), two ICMPv6 rules for neighbour discovery 208, DROP 208, ERROR 232.
	want := Layout{
		HookEntry:  [numHooks]uint32{hookLocalIn: 0, hookForward: 208, hookLocalOut: 416},
		Underflow:  [numHooks]uint32{hookLocalIn: 0, hookForward: 208, hookLocalOut: 1808},
		NumEntries: 10,
		Size:       2248,
	}
	if layout != want || len(entries) != int(want.Size) {
		t.Fatalf("layout = %+v (%d bytes), want %+v", layout, len(entries), want)
	}
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
	if target, next := le.Uint16(dst[ipv6.targetOffsetAt:]), le.Uint16(dst[ipv6.nextOffsetAt:]); target != 216 || next != 256 {
		t.Errorf("-d rule: target_offset %d, next_offset %d; want 216, 256", target, next)
	}
	if name := string(dst[ipv6.entrySize+extensionNameAt : ipv6.entrySize+extensionNameAt+4]); name != "udp\x00" {
		t.Errorf("-d rule's match %q, want udp", name)
	}
	if icmp := entries[1392:]; icmp[ipv6.protoAt] != byte(ICMPv6) || le.Uint16(icmp[ipv6.targetOffsetAt:]) != uint16(ipv6.entrySize) {
		t.Errorf("neighbour discovery rule: protocol %d, target_offset %d; want ICMPv6 and no match", icmp[ipv6.protoAt], le.Uint16(icmp[ipv6.targetOffsetAt:]))
	}
}

func TestReplaceRequestGolden(t *testing.T) {
	entries, layout := ipv4.FilterTable(goldenRules())
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
	_, written := ipv4.FilterTable(goldenRules())
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
