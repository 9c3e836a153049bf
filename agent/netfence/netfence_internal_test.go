package netfence

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestParseAllow(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Rule
	}{
		{"10.0.0.0/8:443", Rule{Dst: netip.MustParsePrefix("10.0.0.0/8"), Proto: TCP, DstPorts: Ports{443, 443}}},
		{"10.0.0.0/8:443/tcp", Rule{Dst: netip.MustParsePrefix("10.0.0.0/8"), Proto: TCP, DstPorts: Ports{443, 443}}},
		{"192.0.2.7:1000-2000/udp", Rule{Dst: netip.MustParsePrefix("192.0.2.7/32"), Proto: UDP, DstPorts: Ports{1000, 2000}}},
		{"0.0.0.0/0:53/udp", Rule{Dst: netip.MustParsePrefix("0.0.0.0/0"), Proto: UDP, DstPorts: Ports{53, 53}}},
		{"2001:db8::/32:443", Rule{Dst: netip.MustParsePrefix("2001:db8::/32"), Proto: TCP, DstPorts: Ports{443, 443}}},
		{"[2001:db8::1]:53/udp", Rule{Dst: netip.MustParsePrefix("2001:db8::1/128"), Proto: UDP, DstPorts: Ports{53, 53}}},
	} {
		got, err := ParseAllow(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseAllow(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestParseAllowRefusesWhatIsNotOneRuleInOneLine(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.1/8:443":        "host bits set; write 10.0.0.0/8",
		"10.0.0.0/8":            "want DEST:PORT",
		":443":                  "want DEST:PORT",
		"10.0.0.0/8:0":          `"0" is not a port`,
		"10.0.0.0/8:70000":      `"70000" is not a port`,
		"10.0.0.0/8:20-10":      `"20-10" is not a port`,
		"10.0.0.0/8:443/sctp":   `"443/sctp" is not a port`,
		"example.com:443":       "neither a CIDR nor an address",
		"2001:db8::1:443":       "write an IPv6 address in brackets",
		"[10.0.0.1]:443":        "write an IPv6 address in brackets",
		"[fe80::1%eth0]:443":    "neither a CIDR nor an address",
		"::ffff:10.0.0.0/104:1": "IPv4-mapped",
	} {
		_, err := ParseAllow(in)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("ParseAllow(%q) = %v, want one line with %q", in, err, want)
		}
	}
}

func TestOutputRulesPutLoopbackAndTheAgentsRepliesFirstAndAllowEachOnce(t *testing.T) {
	allow := Rule{Dst: netip.MustParsePrefix("10.0.0.0/8"), Proto: TCP, DstPorts: Ports{443, 443}}
	runners := netip.MustParsePrefix("10.88.0.0/16")
	got := OutputRules([]netip.Prefix{runners}, AgentReplyPorts, []Rule{allow, allow})
	want := []Rule{{OutInterface: "lo"}, {Dst: runners, Proto: TCP, SrcPorts: Ports{7543, 7543}}, {Dst: runners, Proto: TCP, SrcPorts: Ports{7544, 7544}}, allow}
	if len(got) != len(want) {
		t.Fatalf("OutputRules = %+v, want %+v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("rule %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	allowed := "netfence: IPv4 and IPv6 egress allowed only to interface lo, tcp replies from port 7543 to 10.88.0.0/16, tcp replies from port 7544 to 10.88.0.0/16, tcp 10.0.0.0/8 port 443; "
	for _, tc := range []struct {
		fenced []Fenced
		want   string
	}{
		{[]Fenced{{"IPv4", true}, {"IPv6", true}}, "other tcp is refused at once (a reset), and udp to the fence check's witness 127.0.75.44 (port unreachable); everything else is dropped"},
		{[]Fenced{{"IPv4", false}, {"IPv6", false}}, "everything else is dropped, udp to the fence check's witness 127.0.75.44 included (this runtime has no REJECT target: a denied tcp connect waits for its timeout)"},
		{[]Fenced{{"IPv4", true}, {"IPv6", false}}, "other IPv4 tcp is refused at once (a reset); everything else is dropped (IPv6: this runtime has no REJECT target)"},
	} {
		if line := Describe(tc.fenced, got); line != allowed+tc.want {
			t.Errorf("Describe(%v) = %q\nwant %q", tc.fenced, line, allowed+tc.want)
		}
	}
}

// Replies are accepted only from the ports given, each once, to each reply-to network; with no
// port none is (issue 39: without the agent CA nothing holds 7543, and a job could send from it).
func TestOutputRulesAcceptRepliesOnlyFromTheGivenPorts(t *testing.T) {
	replyTo := []netip.Prefix{netip.MustParsePrefix("10.88.0.0/16"), netip.MustParsePrefix("fd00:88::/64")}
	allow := Rule{Dst: netip.MustParsePrefix("10.0.0.0/8"), Proto: TCP, DstPorts: Ports{443, 443}}
	for _, tc := range []struct {
		ports []uint16
		want  []Rule
	}{
		{nil, []Rule{{OutInterface: "lo"}, allow}},
		{[]uint16{7544}, []Rule{{OutInterface: "lo"}, {Dst: replyTo[0], Proto: TCP, SrcPorts: Ports{7544, 7544}}, {Dst: replyTo[1], Proto: TCP, SrcPorts: Ports{7544, 7544}}, allow}},
		{[]uint16{7544, 7543, 7544}, []Rule{{OutInterface: "lo"},
			{Dst: replyTo[0], Proto: TCP, SrcPorts: Ports{7544, 7544}}, {Dst: replyTo[1], Proto: TCP, SrcPorts: Ports{7544, 7544}},
			{Dst: replyTo[0], Proto: TCP, SrcPorts: Ports{7543, 7543}}, {Dst: replyTo[1], Proto: TCP, SrcPorts: Ports{7543, 7543}}, allow}},
	} {
		if got := OutputRules(replyTo, tc.ports, []Rule{allow}); !slices.Equal(got, tc.want) {
			t.Errorf("OutputRules with reply ports %v = %v\nwant %v", tc.ports, got, tc.want)
		}
	}
}

func TestOutputRulesAllowNeighborDiscoveryOnlyForIPv6Destinations(t *testing.T) {
	v4 := Rule{Dst: netip.MustParsePrefix("10.0.0.0/8"), Proto: TCP, DstPorts: Ports{443, 443}}
	v6 := Rule{Dst: netip.MustParsePrefix("2001:db8::/32"), Proto: TCP, DstPorts: Ports{443, 443}}
	for _, r := range OutputRules(nil, nil, []Rule{v4}) {
		if r.Proto == ICMPv6 {
			t.Errorf("IPv4 destinations only, yet %s", r)
		}
	}
	want := []Rule{{Dst: solicitedNodes, Proto: ICMPv6}, {Dst: v6.Dst, Proto: ICMPv6}}
	if got := OutputRules(nil, nil, []Rule{v4, v6}); !slices.Equal(got[len(got)-2:], want) {
		t.Errorf("an IPv6 destination, yet OUTPUT ends %v, want %v", got[len(got)-2:], want)
	}
}

// acceptsICMPv6 reports whether rules accept ICMPv6 to dst (a rule of every protocol would too).
func acceptsICMPv6(rules []Rule, dst netip.Addr) bool {
	return slices.ContainsFunc(rules, func(r Rule) bool {
		return r.OutInterface == "" && (r.Proto == ICMPv6 || r.Proto == 0) && r.SrcPorts.Any() && r.DstPorts.Any() &&
			(!r.Dst.IsValid() || r.Dst.Contains(dst))
	})
}

// ICMPv6 goes only where the allowed IPv6 destinations need it: neighbour solicitations to
// solicited-node multicast groups, and answers to the neighbours that ask, which are the allowed
// destinations on the link and the gateways. Not to every link-local address (the node's, other
// pods' on a bridge) nor to the link's other multicast groups (ff02::1 reaches every neighbour).
func TestOutputRulesAllowICMPv6OnlyAsAllowedDestinationsNeedIt(t *testing.T) {
	v6 := Rule{Dst: netip.MustParsePrefix("2001:db8::5/128"), Proto: TCP, DstPorts: Ports{443, 443}}
	gateway := netip.MustParseAddr("fe80::ecee:eeff:feee:eeee")
	rules := OutputRules(nil, nil, []Rule{v6})
	for _, dst := range []string{"fe80::1", gateway.String(), "ff02::1", "ff02::2", "ff02::16", "2001:db8::6"} {
		if acceptsICMPv6(rules, netip.MustParseAddr(dst)) {
			t.Errorf("ICMPv6 to %s accepted: %v", dst, rules)
		}
	}
	for _, dst := range []string{"ff02::1:ff00:5", "ff02::1:ff12:3456", "2001:db8::5"} {
		if !acceptsICMPv6(rules, netip.MustParseAddr(dst)) {
			t.Errorf("ICMPv6 to %s dropped: %v", dst, rules)
		}
	}
	// A gateway read from the pod's routes is answered; no other link-local address is.
	rules = OutputRules(nil, nil, append([]Rule{v6}, gatewayRules([]netip.Addr{gateway})...))
	if !acceptsICMPv6(rules, gateway) || acceptsICMPv6(rules, netip.MustParseAddr("fe80::1")) {
		t.Errorf("with the gateway %s: %v", gateway, rules)
	}
}

// withGateways reads the gateways only for an IPv6 destination, and a failure to read them fails
// the verb in one line, before the table is touched (it would otherwise need root here): the
// fence is not written without them, nor widened to every link-local address.
func TestCommandFailsClosedWithoutTheGateways(t *testing.T) {
	reads := 0
	readGateways = func() ([]netip.Addr, error) {
		reads++
		return nil, errors.New("reading the IPv6 routes for their gateways: operation not supported")
	}
	t.Cleanup(func() { readGateways = ipv6Gateways })
	if allows, err := withGateways([]Rule{{Dst: netip.MustParsePrefix("10.0.0.0/8"), Proto: TCP, DstPorts: Ports{443, 443}}}); err != nil || len(allows) != 1 || reads != 0 {
		t.Errorf("IPv4 destinations only: %v, %v after %d reads; want them as they are, unread", allows, err, reads)
	}
	var out bytes.Buffer
	err := Command([]string{"--reply-to", "10.88.0.0/16", "--reply-port", "7544", "--allow", "[2001:db8::5]:443"}, &out)
	if err == nil || !strings.Contains(err.Error(), "operation not supported: without the pod's IPv6 gateways") ||
		!strings.Contains(err.Error(), "so it is not written") || strings.Contains(err.Error(), "\n") || out.Len() != 0 || reads != 1 {
		t.Errorf("Command with the routes unreadable: %v, printed %q after %d reads; want one line saying the fence is not written", err, out.String(), reads)
	}
}

func TestReadNameserversAllowsDNSToEachNameserver(t *testing.T) {
	path := filepath.Join(t.TempDir(), "resolv.conf")
	conf := "search ns.svc.cluster.local\nnameserver 10.96.0.10\nnameserver fd00::10\nnameserver 10.96.0.11\noptions ndots:5\n"
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	servers, err := readNameservers(path)
	if err != nil {
		t.Fatal(err)
	}
	rules := DNSRules(servers)
	var got []string
	for _, r := range rules {
		got = append(got, r.String())
	}
	want := "udp 10.96.0.10/32 port 53, tcp 10.96.0.10/32 port 53, udp fd00::10/128 port 53, tcp fd00::10/128 port 53, udp 10.96.0.11/32 port 53, tcp 10.96.0.11/32 port 53"
	if strings.Join(got, ", ") != want {
		t.Errorf("DNS rules = %s, want %s", strings.Join(got, ", "), want)
	}

	if err := os.WriteFile(path, []byte("search example\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readNameservers(path); err == nil || !strings.Contains(err.Error(), "names no nameserver") {
		t.Errorf("readNameservers without nameservers = %v, want an error", err)
	}
}

type fakeResolver map[string][]netip.Addr

func (f fakeResolver) LookupNetIP(_ context.Context, network, host string) ([]netip.Addr, error) {
	if network != "ip" {
		return nil, errors.New("asked for " + network)
	}
	if addrs, ok := f[host]; ok {
		return addrs, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func TestResolveHostsAllowsEveryAddressAndFailsClosed(t *testing.T) {
	r := fakeResolver{"registry.example": {netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("::ffff:192.0.2.2"), netip.MustParseAddr("2001:db8::7")}}
	rules, err := resolveHosts(context.Background(), r, []hostAllow{{host: "registry.example", proto: TCP, ports: Ports{443, 443}}})
	if err != nil {
		t.Fatal(err)
	}
	want := []Rule{
		{Dst: netip.MustParsePrefix("192.0.2.1/32"), Proto: TCP, DstPorts: Ports{443, 443}},
		{Dst: netip.MustParsePrefix("192.0.2.2/32"), Proto: TCP, DstPorts: Ports{443, 443}},
		{Dst: netip.MustParsePrefix("2001:db8::7/128"), Proto: TCP, DstPorts: Ports{443, 443}},
	}
	if len(rules) != 3 || rules[0] != want[0] || rules[1] != want[1] || rules[2] != want[2] {
		t.Errorf("rules = %+v, want %+v", rules, want)
	}
	_, err = resolveHosts(context.Background(), r, []hostAllow{{host: "registry.example"}, {host: "gone.example"}})
	if err == nil || !strings.Contains(err.Error(), "--allow-host gone.example: cannot resolve it") {
		t.Errorf("an unresolvable host = %v, want an error naming it", err)
	}
}

func TestCommandRefusesBadFlagsBeforeTouchingTheTable(t *testing.T) {
	for _, args := range [][]string{{"--allow", "10.0.0.0/8"}, {"--allow-dns=maybe"}, {"--deny", "x"}, {"extra"}, {"--allow", "10.0.0.0/8:443"}, {"--reply-to", "10.88.0.1/16"},
		{"--reply-to", "0.0.0.0/0"}, {"--reply-to", "10.88.0.0/16", "--reply-to", "::/0"},
		{"--reply-to", "10.88.0.0/16", "--reply-port", "8080"}, {"--reply-to", "10.88.0.0/16", "--reply-port", "0"}, {"--reply-port"}} {
		var out bytes.Buffer
		err := Command(args, &out)
		if err == nil || !strings.Contains(err.Error(), "see netfence -h") || out.Len() != 0 {
			t.Errorf("Command(%q) = %v, printed %q; want a usage error and nothing printed", args, err, out.String())
		}
	}
	var out bytes.Buffer
	if err := Command([]string{"-h"}, &out); err != nil || !strings.HasPrefix(out.String(), "usage: sandbox-executor-agent netfence") || !strings.Contains(out.String(), "--reply-port PORT") {
		t.Errorf("Command(-h) = %v, printed %q; want the usage, --reply-port in it", err, out.String())
	}
}

// --reply-port names a port the agent listens on, and nothing else: a reply rule for any other
// port would let a job send from it to every --reply-to network. Refused in one line, before the
// table is touched (the verb would otherwise need root here).
func TestCommandRefusesReplyPortsTheAgentDoesNotHold(t *testing.T) {
	for port, want := range map[string]string{
		"0":     `"0" is not a port from 1 to 65535`,
		"65536": `"65536" is not a port from 1 to 65535`,
		"-1":    `"-1" is not a port from 1 to 65535`,
		"":      `"" is not a port from 1 to 65535`,
		"http":  `"http" is not a port from 1 to 65535`,
		"7545":  "7545 is not a port of the agent's: name 7543 (the stage transport) or 7544 (the readiness probe)",
		"22":    "22 is not a port of the agent's",
		"443":   "443 is not a port of the agent's",
	} {
		var out bytes.Buffer
		err := Command([]string{"--reply-to", "10.88.0.0/16", "--reply-port", "7544", "--reply-port", port}, &out)
		if err == nil || !strings.Contains(err.Error(), "invalid value") || !strings.Contains(err.Error(), "-reply-port: "+want) ||
			!strings.HasSuffix(err.Error(), "(see netfence -h)") || strings.Contains(err.Error(), "\n") || out.Len() != 0 {
			t.Errorf("--reply-port %q: %v, printed %q; want one line with %q", port, err, out.String(), want)
		}
	}
	for _, port := range []string{"7543", "7544"} {
		if got, err := parseReplyPort(port); err != nil || strconv.Itoa(int(got)) != port {
			t.Errorf("parseReplyPort(%s) = %d, %v", port, got, err)
		}
	}
}
