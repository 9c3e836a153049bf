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
const Usage = `usage: sandbox-executor-agent netfence [--allow CIDR:PORT[-PORT][/tcp|/udp]]... [--allow-host HOST:PORT[-PORT][/tcp|/udp]]... [--allow-dns]

Replaces the sandbox's IPv4 filter table: INPUT and FORWARD accept; OUTPUT accepts loopback,
the replies of the agent's servers (tcp source ports 7543 and 7544), and the destinations
allowed below, and drops everything else. Run it as root with CAP_NET_ADMIN and CAP_NET_RAW
in an init container of a gVisor pod whose runsc has net-raw = true.

  --allow CIDR:PORT[-PORT][/tcp|/udp]   a destination network and port range (tcp when no
                                        protocol is named); repeat for more
  --allow-host HOST:PORT[-PORT][/tcp|/udp]
                                        every IPv4 address HOST resolves to now, through the
                                        pod's resolver; an unresolvable HOST fails
  --allow-dns                           udp and tcp port 53 to each nameserver of /etc/resolv.conf

It refuses to run when an interface has an IPv6 address beyond loopback and link-local: it
fences IPv4 only.
`

// resolvConf is where --allow-dns reads the pod's nameservers.
const resolvConf = "/etc/resolv.conf"

// resolveTimeout bounds resolving every --allow-host.
const resolveTimeout = 10 * time.Second

// fixCapabilities names what a failed netfilter call needs, in every failure's one line.
const fixCapabilities = "runsc needs net-raw = true and this container CAP_NET_ADMIN and CAP_NET_RAW as root, or set the chart's jobDefaults.netstackFence=false to rely on NetworkPolicy alone"

// AgentReplyPorts are the agent's listening ports whose replies OUTPUT accepts: the stage
// transport (TLS) and the readiness probe. This is safe because the agent, the job container's
// PID 1, holds listeners on them on the wildcard address for the pod's whole life: no job
// process can bind either port to originate connections from it (bind fails with EADDRINUSE
// even with SO_REUSEADDR, and Go's listeners do not set SO_REUSEPORT).
var AgentReplyPorts = []uint16{wire.NetworkPort, wire.FencePort}

// Command runs `netfence` with args and prints one line saying what is allowed.
func Command(args []string, stdout io.Writer) error {
	var allows []Rule
	var hosts []hostAllow
	var allowDNS bool
	fs := flag.NewFlagSet("netfence", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
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
	if err := refuseGlobalIPv6(); err != nil {
		return err
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
	output := OutputRules(allows)
	if err := Apply(output); err != nil {
		return err
	}
	_, err := fmt.Fprintln(stdout, Describe(output))
	return err
}

// OutputRules is the OUTPUT chain before its DROP policy: loopback, the agent's replies, then
// allows in order, each once.
func OutputRules(allows []Rule) []Rule {
	rules := []Rule{{OutInterface: "lo"}}
	for _, port := range AgentReplyPorts {
		rules = append(rules, Rule{Proto: TCP, SrcPorts: Ports{port, port}})
	}
	for _, r := range allows {
		if !slices.Contains(rules, r) {
			rules = append(rules, r)
		}
	}
	return rules
}

// Describe is the success line: every rule OUTPUT accepts, in order.
func Describe(output []Rule) string {
	parts := make([]string, len(output))
	for i, r := range output {
		parts[i] = r.String()
	}
	return "netfence: IPv4 egress allowed only to " + strings.Join(parts, ", ") + "; everything else is dropped"
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
	if r.Dst.IsValid() {
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

// ParseAllow parses --allow's CIDR:PORT[-PORT][/tcp|/udp]; a bare address is a /32.
func ParseAllow(v string) (Rule, error) {
	dst, ports, proto, err := splitAllow(v)
	if err != nil {
		return Rule{}, err
	}
	prefix, err := netip.ParsePrefix(dst)
	if err != nil {
		addr, addrErr := netip.ParseAddr(dst)
		if addrErr != nil {
			return Rule{}, fmt.Errorf("%q is neither an IPv4 CIDR nor an address", dst)
		}
		prefix = netip.PrefixFrom(addr, addr.BitLen())
	}
	if !prefix.Addr().Is4() {
		return Rule{}, fmt.Errorf("%s is not IPv4, and netfence fences IPv4 only", prefix)
	}
	if prefix.Masked() != prefix {
		return Rule{}, fmt.Errorf("%s has host bits set; write %s", prefix, prefix.Masked())
	}
	return Rule{Dst: prefix, Proto: proto, DstPorts: ports}, nil
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
			rules = append(rules, Rule{Dst: netip.PrefixFrom(s, 32), Proto: proto, DstPorts: Ports{53, 53}})
		}
	}
	return rules
}

// readNameservers returns the IPv4 nameservers of a resolv.conf; none is an error, since
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
		if addr, err := netip.ParseAddr(fields[1]); err == nil && addr.Unmap().Is4() {
			servers = append(servers, addr.Unmap())
		}
	}
	if err := lines.Err(); err != nil {
		return nil, fmt.Errorf("--allow-dns: %s: %v", path, err)
	}
	if len(servers) == 0 {
		return nil, fmt.Errorf("--allow-dns: %s names no IPv4 nameserver", path)
	}
	return servers, nil
}

// resolver is what resolveHosts asks; *net.Resolver.
type resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// resolveHosts turns each --allow-host into one rule per IPv4 address it has now. Failing to
// resolve one fails the fence: a fence that silently allows less than asked would fail the job
// later, and one that allowed more is not a fence.
func resolveHosts(ctx context.Context, r resolver, hosts []hostAllow) ([]Rule, error) {
	var rules []Rule
	for _, h := range hosts {
		addrs, err := r.LookupNetIP(ctx, "ip4", h.host)
		if err != nil {
			return nil, fmt.Errorf("--allow-host %s: cannot resolve it through the pod's resolver: %v", h.host, err)
		}
		for _, a := range addrs {
			rules = append(rules, Rule{Dst: netip.PrefixFrom(a.Unmap(), 32), Proto: h.proto, DstPorts: h.ports})
		}
	}
	return rules, nil
}

// refuseGlobalIPv6 fails when an interface has an IPv6 address that could reach beyond the
// link: netfence writes the IPv4 table only, and must not leave IPv6 open.
func refuseGlobalIPv6() error {
	ifaces, err := net.Interfaces()
	if err != nil {
		return fmt.Errorf("cannot list the pod's interfaces to check for IPv6: %v", err)
	}
	for _, iface := range ifaces {
		addrs, err := iface.Addrs()
		if err != nil {
			return fmt.Errorf("cannot list the addresses of interface %s to check for IPv6: %v", iface.Name, err)
		}
		if addr, ok := globalIPv6(addrs); ok {
			return fmt.Errorf("interface %s has IPv6 address %s and netfence fences IPv4 only: give job pods no IPv6, or set the chart's jobDefaults.netstackFence=false", iface.Name, addr)
		}
	}
	return nil
}

// globalIPv6 returns the first IPv6 address of addrs that is neither loopback nor link-local.
func globalIPv6(addrs []net.Addr) (netip.Addr, bool) {
	for _, a := range addrs {
		ipnet, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		addr, ok := netip.AddrFromSlice(ipnet.IP)
		if !ok || addr.Unmap().Is4() || addr.IsLoopback() || addr.IsLinkLocalUnicast() {
			continue
		}
		return addr, true
	}
	return netip.Addr{}, false
}
