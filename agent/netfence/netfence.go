// Package netfence is the agent's `netfence` verb: the job pod's second egress fence, written
// into the gVisor sandbox's own network stack (netstack), which does not depend on the node's
// NetworkPolicy agent. An init container runs it inside the sandbox with CAP_NET_ADMIN and
// CAP_NET_RAW before the job container starts; the job container drops every capability and
// cannot change it. It writes the IPv4 filter table with IPT_SO_SET_REPLACE on a raw socket,
// as iptables-restore does, with no iptables binary: the agent is a static binary copied into
// any image. docs/security.md#the-netstack-fence.
//
// It uses only the standard library, like the rest of the agent.
package netfence

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
)

// Usage is the verb's help.
const Usage = `usage: sandbox-executor-agent netfence --reply-to CIDR... [--reply-port PORT]... [--allow CIDR:PORT[-PORT][/tcp|/udp]]... [--allow-host HOST:PORT[-PORT][/tcp|/udp]]... [--allow-dns]

Replaces the sandbox's IPv4 and IPv6 filter tables: INPUT accepts, FORWARD drops; OUTPUT accepts
loopback, the replies of the agent's servers (tcp from each --reply-port) to --reply-to, and the
destinations allowed below (for IPv6 ones, with the ICMPv6 of neighbour discovery to them, the
solicited-node groups and the pod's IPv6 gateways, read from its routes); it refuses all other
tcp at once with a reset and udp to 127.0.75.44 (the fence check's witness) with
icmp-port-unreachable, and drops everything else.
A runtime without the REJECT target gets the same table dropping instead of refusing. Run it as root with CAP_NET_ADMIN
and CAP_NET_RAW in an init container of a gVisor pod whose runsc has net-raw = true.

  --reply-to CIDR                       required: a network the agent's clients connect from
                                        (runner pods, the kubelet); repeat for more
  --reply-port PORT                     a port the agent listens on in this pod, whose replies
                                        go to --reply-to: 7543 (the stage transport, served
                                        with the agent CA) or 7544 (the readiness probe, served
                                        with the fence check's addresses); repeat for both.
                                        Without it no reply is allowed. Name only a port the
                                        agent serves: a job may bind one it does not, and send
                                        from it through the rule
  --allow CIDR:PORT[-PORT][/tcp|/udp]   a destination network (or address; [ADDR] for IPv6)
                                        and port range, tcp when no protocol is named;
                                        repeat for more
  --allow-host HOST:PORT[-PORT][/tcp|/udp]
                                        every address HOST resolves to now, through the pod's
                                        resolver; an unresolvable HOST fails
  --allow-dns                           udp and tcp port 53 to each nameserver of /etc/resolv.conf
`

// resolvConf is where --allow-dns reads the pod's nameservers.
const resolvConf = "/etc/resolv.conf"

// resolveTimeout bounds resolving every --allow-host.
const resolveTimeout = 10 * time.Second

// fixCapabilities names what a failed netfilter call needs, in every failure's one line.
const fixCapabilities = "runsc needs net-raw = true and this container CAP_NET_ADMIN and CAP_NET_RAW as root, or set the chart's jobDefaults.netstackFence.enabled=false to rely on NetworkPolicy alone"

// AgentReplyPorts are the agent's listening ports, the only ones --reply-port may name: the
// stage transport (TLS, served only when the pod has the agent CA) and the readiness probe
// (served only when the pod names the fence check's addresses). OUTPUT accepts replies from
// those of them the pod's agent serves, which the template says with --reply-port: the agent,
// the job container's PID 1, holds listeners on them on the wildcard address for the pod's
// whole life. Under Linux that stops a job from binding either port to originate connections
// from it (EADDRINUSE even with SO_REUSEADDR; Go's listeners do not set SO_REUSEPORT), but
// gVisor lets a socket with SO_REUSEADDR bind the pod's own address on that port and connect
// out through the rule (measured: docs/security.md#the-netstack-fence). So replies are
// accepted only to the --reply-to networks, never to everywhere, and only from a port the
// agent holds: a port it does not listen on is any job's to bind, and a reply rule for it
// would let the job send from it to every --reply-to network.
var AgentReplyPorts = []uint16{wire.NetworkPort, wire.FencePort}

// Command runs `netfence` with args and prints one line saying what is allowed.
func Command(args []string, stdout io.Writer) error {
	if role := os.Getenv(ProbeRoleEnv); role != "" {
		return runProbeRole(role, stdout) // a child of ProveRuntime
	}
	var replyTo []netip.Prefix
	var replyPorts []uint16
	var allows []Rule
	var hosts []hostAllow
	var allowDNS bool
	fs := flag.NewFlagSet("netfence", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Func("reply-to", "CIDR", func(v string) error {
		p, err := parseReplyTo(v)
		replyTo = append(replyTo, p)
		return err
	})
	fs.Func("reply-port", "PORT", func(v string) error {
		port, err := parseReplyPort(v)
		replyPorts = append(replyPorts, port)
		return err
	})
	fs.Func("allow", "CIDR:PORT[-PORT][/tcp|/udp]", func(v string) error {
		r, err := ParseAllow(v)
		allows = append(allows, r)
		return err
	})
	fs.Func("allow-host", "HOST:PORT[-PORT][/tcp|/udp]", func(v string) error {
		h, err := parseHostAllow(v)
		hosts = append(hosts, h)
		return err
	})
	fs.BoolVar(&allowDNS, "allow-dns", false, "udp and tcp 53 to each nameserver")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			_, err = io.WriteString(stdout, Usage)
			return err
		}
		return fmt.Errorf("%v (see netfence -h)", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (see netfence -h)", fs.Arg(0))
	}
	if len(replyTo) == 0 {
		return errors.New("--reply-to CIDR is required: the networks the agent's clients (runner pods, the kubelet) connect from (see netfence -h)")
	}
	if allowDNS {
		servers, err := readNameservers(resolvConf)
		if err != nil {
			return err
		}
		allows = append(allows, DNSRules(servers)...)
	}
	if len(hosts) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
		defer cancel()
		resolved, err := resolveHosts(ctx, net.DefaultResolver, hosts)
		if err != nil {
			return err
		}
		allows = append(allows, resolved...)
	}
	allows, err := withGateways(allows)
	if err != nil {
		return err
	}
	output := OutputRules(replyTo, replyPorts, allows)
	if err := ProveRuntime(); err != nil {
		return err
	}
	fenced, err := Apply(output)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(stdout, Describe(fenced, output))
	return err
}

// Fenced is one family's table as Apply wrote it.
type Fenced struct {
	Family string // "IPv4", "IPv6"
	// RefusesTCP: TCP not accepted is refused at once (a reset); without, the runtime has no
	// REJECT target and the table drops it, as it drops everything else not accepted.
	RefusesTCP bool
}

// solicitedNodes is where IPv6 neighbour solicitations go (RFC 4291 2.7.1): Linux filters them
// in OUTPUT; gVisor's netstack sends them around its filter table.
var solicitedNodes = netip.MustParsePrefix("ff02::1:ff00:0/104")

// neighborDiscovery is the ICMPv6 that the IPv6 destinations of allows need to be reached:
// solicitations to the solicited-node groups, and answers to the neighbours that solicit this
// pod, which are its gateways (gatewayRules, among allows) and the allowed destinations on its
// link. netstack cannot match ICMPv6 types, so these accept every ICMPv6 type, echo included, to
// those addresses only: not to other link-local addresses nor to the link's other multicast
// groups (ff02::1 reaches every neighbour). None without an IPv6 destination.
func neighborDiscovery(allows []Rule) []Rule {
	var rules []Rule
	for _, r := range allows {
		if r.Dst.Addr().Is6() {
			if rules == nil {
				rules = []Rule{{Dst: solicitedNodes, Proto: ICMPv6}}
			}
			rules = append(rules, Rule{Dst: r.Dst, Proto: ICMPv6})
		}
	}
	return rules
}

// gatewayRules answer the neighbour solicitations of the pod's IPv6 gateways (ipv6Gateways):
// a router asks from its link-local address, and without an answer it stops forwarding the
// replies of every IPv6 destination to the pod.
func gatewayRules(gateways []netip.Addr) []Rule {
	rules := make([]Rule, 0, len(gateways))
	for _, g := range gateways {
		rules = append(rules, Rule{Dst: netip.PrefixFrom(g, g.BitLen()), Proto: ICMPv6})
	}
	return rules
}

// readGateways is ipv6Gateways, replaced in tests.
var readGateways = ipv6Gateways

// withGateways is allows and, if any of them is an IPv6 destination, the gatewayRules of the
// pod's IPv6 gateways as its routes name them now. A failure to read the routes fails the verb,
// before the table is touched, and so the pod: closed. Neither way around it holds. Writing the
// fence with no gateway rule would cut every IPv6 destination behind a gateway, with nothing to
// say why: the gateway solicits the pod from its link-local address, the answer is dropped, and
// the gateway stops forwarding the replies (TestApplyWithoutGatewaysCutsIPv6ThroughThem: the
// connects time out). Accepting ICMPv6 to all of fe80::/10 instead would silently reopen what
// neighborDiscovery closes. gVisor's netlink answers RTM_GETROUTE dumps with each route's
// RTA_GATEWAY (pkg/sentry/socket/netlink/route); a runtime whose netlink did not would fail here,
// in one line. Reading no gateway at all (IPv6 routes on the link only) is no failure.
func withGateways(allows []Rule) ([]Rule, error) {
	if !slices.ContainsFunc(allows, func(r Rule) bool { return r.Dst.Addr().Is6() }) {
		return allows, nil
	}
	gateways, err := readGateways()
	if err != nil {
		return nil, fmt.Errorf("%v: without the pod's IPv6 gateways the fence would drop their neighbour solicitations' answers and cut every IPv6 destination behind them, so it is not written; allow only IPv4 destinations, or set the chart's jobDefaults.netstackFence.enabled=false to rely on NetworkPolicy alone", err)
	}
	return append(slices.Clip(allows), gatewayRules(gateways)...), nil
}

// OutputRules is the OUTPUT chain before its DROP policy: loopback, the agent's replies from
// each of replyPorts to each replyTo network (none without replyPorts), then allows in order and
// the neighbour discovery of their IPv6 destinations, each once.
func OutputRules(replyTo []netip.Prefix, replyPorts []uint16, allows []Rule) []Rule {
	rules := []Rule{{OutInterface: "lo"}}
	for _, port := range replyPorts {
		for _, dst := range replyTo {
			if r := (Rule{Dst: dst, Proto: TCP, SrcPorts: Ports{port, port}}); !slices.Contains(rules, r) {
				rules = append(rules, r)
			}
		}
	}
	for _, r := range append(slices.Clip(allows), neighborDiscovery(allows)...) {
		if !slices.Contains(rules, r) {
			rules = append(rules, r)
		}
	}
	return rules
}

// Describe is the success line: the families fenced, every rule OUTPUT accepts, in order, and
// how it denies the rest.
func Describe(fenced []Fenced, output []Rule) string {
	var families, refusing, dropping []string
	for _, f := range fenced {
		families = append(families, f.Family)
		if f.RefusesTCP {
			refusing = append(refusing, f.Family)
		} else {
			dropping = append(dropping, f.Family)
		}
	}
	parts := make([]string, len(output))
	for i, r := range output {
		parts[i] = r.String()
	}
	line := "netfence: " + strings.Join(families, " and ") + " egress allowed only to " + strings.Join(parts, ", ") + "; "
	witness := "udp to the fence check's witness " + Witness.String()
	switch {
	case len(dropping) == 0:
		return line + "other tcp is refused at once (a reset), and " + witness + " (port unreachable); everything else is dropped"
	case len(refusing) == 0:
		return line + "everything else is dropped, " + witness + " included (this runtime has no REJECT target: a denied tcp connect waits for its timeout)"
	}
	return line + "other " + strings.Join(refusing, " and ") + " tcp is refused at once (a reset); everything else is dropped (" + strings.Join(dropping, " and ") + ": this runtime has no REJECT target)"
}

func (r Rule) String() string {
	var b strings.Builder
	if r.OutInterface != "" {
		b.WriteString("interface " + r.OutInterface)
	}
	if r.Proto != 0 {
		b.WriteString(r.Proto.String())
	}
	if !r.SrcPorts.Any() {
		b.WriteString(" replies from port " + r.SrcPorts.String())
	}
	if r.Dst.IsValid() && !r.SrcPorts.Any() {
		b.WriteString(" to " + r.Dst.String())
	} else if r.Dst.IsValid() {
		b.WriteString(" " + r.Dst.String())
	}
	if !r.DstPorts.Any() {
		b.WriteString(" port " + r.DstPorts.String())
	}
	return b.String()
}

func (r Ports) String() string {
	if r.First == r.Last {
		return strconv.Itoa(int(r.First))
	}
	return fmt.Sprintf("%d-%d", r.First, r.Last)
}

// ParseAllow parses --allow's CIDR:PORT[-PORT][/tcp|/udp]. A bare address is a network of
// one, and an IPv6 one is bracketed ([2001:db8::1]:443) so that its port cannot be misread.
func ParseAllow(v string) (Rule, error) {
	dst, ports, proto, err := splitAllow(v)
	if err != nil {
		return Rule{}, err
	}
	prefix, err := parseDestination(dst)
	if err != nil {
		return Rule{}, err
	}
	return Rule{Dst: prefix, Proto: proto, DstPorts: ports}, nil
}

func parseDestination(dst string) (netip.Prefix, error) {
	if prefix, err := netip.ParsePrefix(dst); err == nil {
		if prefix.Masked() != prefix {
			return netip.Prefix{}, fmt.Errorf("%s has host bits set; write %s", prefix, prefix.Masked())
		}
		if prefix.Addr().Is4In6() {
			return netip.Prefix{}, fmt.Errorf("%s is an IPv4-mapped IPv6 network; write it as IPv4", prefix)
		}
		return prefix, nil
	}
	inner, bracketed := strings.CutPrefix(dst, "[")
	if bracketed {
		inner, bracketed = strings.CutSuffix(inner, "]")
	}
	addr, err := netip.ParseAddr(inner)
	switch {
	case err != nil || addr.Zone() != "":
		return netip.Prefix{}, fmt.Errorf("%q is neither a CIDR nor an address", dst)
	case addr.Is6() != bracketed:
		return netip.Prefix{}, fmt.Errorf("%q: write an IPv6 address in brackets, [ADDR]:PORT, and an IPv4 one without", dst)
	case addr.Is4In6():
		return netip.Prefix{}, fmt.Errorf("%s is an IPv4-mapped IPv6 address; write it as IPv4", addr)
	}
	return netip.PrefixFrom(addr, addr.BitLen()), nil
}

// parseReplyTo parses a --reply-to network, which must not be every address: the agent's ports
// would then answer anywhere, and a job that got one of them could send anywhere from it.
func parseReplyTo(v string) (netip.Prefix, error) {
	p, err := parseDestination(v)
	if err == nil && p.Bits() == 0 {
		return netip.Prefix{}, fmt.Errorf("%s is every address: name the networks the agent's clients connect from (the runner pods', the kubelet's)", p)
	}
	return p, err
}

// parseReplyPort parses a --reply-port, which must be one of the agent's own ports
// (AgentReplyPorts): replies from any other port would be a job's, sent wherever --reply-to
// reaches.
func parseReplyPort(v string) (uint16, error) {
	port, err := strconv.ParseUint(v, 10, 16)
	if err != nil || port == 0 {
		return 0, fmt.Errorf("%q is not a port from 1 to 65535", v)
	}
	if !slices.Contains(AgentReplyPorts, uint16(port)) {
		return 0, fmt.Errorf("%d is not a port of the agent's: name %d (the stage transport) or %d (the readiness probe), the ports the agent listens on", port, wire.NetworkPort, wire.FencePort)
	}
	return uint16(port), nil
}

// hostAllow is one --allow-host before resolution.
type hostAllow struct {
	host  string
	proto Proto
	ports Ports
}

func parseHostAllow(v string) (hostAllow, error) {
	host, ports, proto, err := splitAllow(v)
	if err != nil {
		return hostAllow{}, err
	}
	return hostAllow{host: host, proto: proto, ports: ports}, nil
}

// splitAllow splits DEST:PORT[-PORT][/tcp|/udp].
func splitAllow(spec string) (dest string, ports Ports, proto Proto, err error) {
	proto = TCP
	if rest, ok := strings.CutSuffix(spec, "/udp"); ok {
		spec, proto = rest, UDP
	} else {
		spec = strings.TrimSuffix(spec, "/tcp")
	}
	i := strings.LastIndexByte(spec, ':')
	if i <= 0 {
		return "", Ports{}, 0, errors.New("want DEST:PORT[-PORT][/tcp|/udp]")
	}
	dest, portSpec := spec[:i], spec[i+1:]
	first, last, isRange := strings.Cut(portSpec, "-")
	if !isRange {
		last = first
	}
	lo, errLo := strconv.ParseUint(first, 10, 16)
	hi, errHi := strconv.ParseUint(last, 10, 16)
	if errLo != nil || errHi != nil || lo == 0 || hi < lo {
		return "", Ports{}, 0, fmt.Errorf("%q is not a port or a range FIRST-LAST of ports from 1 to 65535", portSpec)
	}
	return dest, Ports{uint16(lo), uint16(hi)}, proto, nil
}

// DNSRules allow udp and tcp port 53 to each server.
func DNSRules(servers []netip.Addr) []Rule {
	var rules []Rule
	for _, s := range servers {
		for _, proto := range []Proto{UDP, TCP} {
			rules = append(rules, Rule{Dst: netip.PrefixFrom(s, s.BitLen()), Proto: proto, DstPorts: Ports{53, 53}})
		}
	}
	return rules
}

// readNameservers returns the nameservers of a resolv.conf; none is an error, since
// --allow-dns would then allow nothing the job expects.
func readNameservers(path string) ([]netip.Addr, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--allow-dns: %v", err)
	}
	defer f.Close()
	var servers []netip.Addr
	lines := bufio.NewScanner(f)
	for lines.Scan() {
		fields := strings.Fields(lines.Text())
		if len(fields) < 2 || fields[0] != "nameserver" {
			continue
		}
		if addr, err := netip.ParseAddr(fields[1]); err == nil && addr.Zone() == "" {
			servers = append(servers, addr.Unmap())
		}
	}
	if err := lines.Err(); err != nil {
		return nil, fmt.Errorf("--allow-dns: %s: %v", path, err)
	}
	if len(servers) == 0 {
		return nil, fmt.Errorf("--allow-dns: %s names no nameserver", path)
	}
	return servers, nil
}

// resolver is what resolveHosts asks; *net.Resolver.
type resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// resolveHosts turns each --allow-host into one rule per address it has now. Failing to
// resolve one fails the fence: a fence that silently allows less than asked would fail the job
// later, and one that allowed more is not a fence.
func resolveHosts(ctx context.Context, r resolver, hosts []hostAllow) ([]Rule, error) {
	var rules []Rule
	for _, h := range hosts {
		addrs, err := r.LookupNetIP(ctx, "ip", h.host)
		if err != nil {
			return nil, fmt.Errorf("--allow-host %s: cannot resolve it through the pod's resolver: %v", h.host, err)
		}
		for _, a := range addrs {
			a = a.Unmap()
			rules = append(rules, Rule{Dst: netip.PrefixFrom(a, a.BitLen()), Proto: h.proto, DstPorts: h.ports})
		}
	}
	return rules, nil
}
