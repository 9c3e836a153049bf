//go:build security

package security

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
)

// listenerPort is where the neighbour job serves HTTP, on all its addresses.
const listenerPort = 8081

// TestJobNetworkIsFenced: a job reaches the GitLab instance (the allowlist, and the positive
// control of every check) and nothing else: not the cloud metadata address, not "the internet",
// not another port of the GitLab instance, not the node (kubelet, a listener on all of the
// node's addresses reached by the node IP, the pod gateway and IPv6), not the agent-sandbox
// webhook Service, not another job's pod, over IPv4 or IPv6, by address or by name. Every
// target that can answer is first shown to answer from the node itself.
func TestJobNetworkIsFenced(t *testing.T) {
	t.Parallel()
	c := clusterjobs.Connect(t)
	r := c.NewRunner(t, "sec-net", "")
	nodePort := listenOnAllNodeAddresses(t)
	webhook := webhookServiceAddr(t, c)
	// The neighbour's pod has no netstack fence of its own (its fence would drop the replies of
	// its server to the node's positive controls): what is tested is that the job cannot reach it.
	neighbourPool := policyOnlyPoolProbed(t, c, "sec-net-neighbour", 1, true)
	nr := c.NewRunnerWith(t, "sec-net-nb", localcluster.Config{Pools: []localcluster.PoolConfig{{Name: neighbourPool, Images: []string{localcluster.CIImage}}}})
	neighbour := prepared(t, nr, clusterjobs.JobSpec{})
	job := prepared(t, r, clusterjobs.JobSpec{})

	// The neighbour job serves HTTP on IPv4 and IPv6, and reaches itself on both.
	out := neighbour.MustRun(t, probeLib+fmt.Sprintf(`setsid -f node -e 'require("http").createServer((q,s)=>s.end("neighbour\n")).listen(%d,"::")' </dev/null >/dev/null 2>&1
i=0; until curl -s -o /dev/null http://127.0.0.1:%[1]d/ || [ $i -ge 100 ]; do sleep 0.1; i=$((i+1)); done
ll=$(awk '$6=="eth0" && $1 ~ /^fe80/ {print $1}' /proc/net/if_inet6 | sed 's/..../&:/g; s/:$//')
echo "link-local=$ll"
probe self-v4 http://127.0.0.1:%[1]d/
[ -n "$ll" ] && probe self-v6 "http://[$ll%%eth0]:%[1]d/"
probes
`, listenerPort)).Stdout
	self := probeResults(t, out)
	mustControls(t, reachable(t, self, "self-v4", "neighbour"))
	neighbourV4 := neighbour.PodObject(t).Status.PodIP
	neighbourV6 := ""
	if m := regexp.MustCompile(`link-local=(\S+)`).FindStringSubmatch(out); m != nil {
		neighbourV6 = m[1]
		mustControls(t, reachable(t, self, "self-v6", "neighbour"))
	}

	// Positive controls from the node: every target that can answer does.
	bridgeV6 := linkLocal(t, podBridge)
	mustControls(t,
		hostGets(t, url(internet, 80, "/"), "outside"),
		hostGets(t, url(gitlab, gitlabAlt, "/"), "gitlab-alt"),
		hostGets(t, url(neighbourV4, listenerPort, "/"), "neighbour"),
		hostDials(t, net.JoinHostPort(nodeIP, "10250")),
		hostDials(t, net.JoinHostPort(nodeIP, fmt.Sprint(nodePort))),
		hostDials(t, net.JoinHostPort(podGateway, fmt.Sprint(nodePort))),
		hostDials(t, net.JoinHostPort(bridgeV6+"%"+podBridge, fmt.Sprint(nodePort))),
		hostDials(t, webhook),
	)

	probes := []string{
		"control-gitlab " + url(gitlab, 80, "/"),
		"metadata " + url(metadataIP, 80, "/latest/meta-data/"),
		"internet " + url(internet, 80, "/"),
		"gitlab-other-port " + url(gitlab, gitlabAlt, "/"),
		"kubelet " + httpsURL(nodeIP, 10250, "/pods"),
		"node-listener-node-ip " + url(nodeIP, nodePort, "/"),
		"node-listener-pod-gateway " + url(podGateway, nodePort, "/"),
		"node-listener-ipv6 " + url(bridgeV6+"%eth0", nodePort, "/"),
		"webhook-service https://" + webhook + "/",
		"neighbour-ipv4 " + url(neighbourV4, listenerPort, "/"),
		"by-name-internet http://example.com/",
		"by-name-gitlab https://gitlab.com/",
	}
	if neighbourV6 != "" {
		probes = append(probes, "neighbour-ipv6 "+url(neighbourV6+"%eth0", listenerPort, "/"))
	}
	script := probeLib + `echo "resolv: $(grep -v '^#' /etc/resolv.conf | tr '\n' ' ')"
getent hosts example.com gitlab.com; echo "getent-exit=$?"
awk '{print "inet6", $1, $4, $6}' /proc/net/if_inet6
awk '{print "route6", $1, $2, $10}' /proc/net/ipv6_route
`
	for _, p := range probes {
		script += "probe " + p + "\n"
	}
	out = job.MustRun(t, script+"probes\n").Stdout
	res := probeResults(t, out)
	mustControls(t, reachable(t, res, "control-gitlab", "gitlab"))
	for _, p := range probes[1:] {
		blocked(t, res, strings.Fields(p)[0])
	}

	// The job's resolver is cluster DNS, which answers for the cluster domain only and forwards
	// nothing, so no outside name resolves (by-name-* above fail with "could not resolve").
	resolv := regexp.MustCompile(`resolv: (.*)`).FindStringSubmatch(out)
	var nameservers []string
	if resolv != nil {
		for _, m := range regexp.MustCompile(`nameserver (\S+)`).FindAllStringSubmatch(resolv[1], -1) {
			nameservers = append(nameservers, m[1])
		}
	}
	if len(nameservers) == 0 || slices.ContainsFunc(nameservers, func(ns string) bool { return ns != clusterDNS }) {
		t.Errorf("the job's resolv.conf names resolvers other than cluster DNS %s: %v", clusterDNS, resolv)
	} else {
		t.Logf("the job's resolv.conf: %s", resolv[1])
	}
	if strings.Contains(out, "getent-exit=0") {
		t.Errorf("outside names resolve in the job:\n%s", out)
	}
	for _, name := range []string{"by-name-internet", "by-name-gitlab"} {
		if res[name].rc != 6 {
			t.Errorf("%s: curl exit %d, want 6 (could not resolve)", name, res[name].rc)
		}
	}

	// IPv4-only: IPv6 has the loopback and link-local addresses only, and no route beyond them.
	// (gVisor leaves the scope columns zero: the addresses themselves tell.)
	for _, m := range regexp.MustCompile(`(?m)^inet6 ([0-9a-f]{32}) \S+ (\S+)$`).FindAllStringSubmatch(out, -1) {
		if ip := hexIP(t, m[1]); !ip.IsLoopback() && !ip.IsLinkLocalUnicast() {
			t.Errorf("the job has an IPv6 address beyond loopback and link-local: %s on %s", ip, m[2])
		} else {
			t.Logf("IPv6 address %s on %s, as expected", ip, m[2])
		}
	}
	for _, m := range regexp.MustCompile(`(?m)^route6 ([0-9a-f]{32}) (\S+) (\S+)$`).FindAllStringSubmatch(out, -1) {
		if ip := hexIP(t, m[1]); !ip.IsLoopback() && !ip.IsLinkLocalUnicast() && !ip.IsMulticast() {
			t.Errorf("the job has an IPv6 route to %s/%s via %s", ip, m[2], m[3])
		}
	}
	if neighbourV6 == "" {
		t.Log("the neighbour job has no IPv6 link-local address: nothing to reach over IPv6")
	}
}

// hexIP parses an address as /proc/net/if_inet6 and ipv6_route print it.
func hexIP(t *testing.T, h string) net.IP {
	t.Helper()
	b, err := hex.DecodeString(h)
	if err != nil || len(b) != net.IPv6len {
		t.Fatalf("not an IPv6 address: %q", h)
	}
	return net.IP(b)
}

// linkLocal is the node's IPv6 link-local address on an interface.
func linkLocal(t *testing.T, ifname string) string {
	t.Helper()
	ifc, err := net.InterfaceByName(ifname)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ip, ok := a.(*net.IPNet); ok && ip.IP.IsLinkLocalUnicast() {
			return ip.IP.String()
		}
	}
	t.Fatalf("%s has no IPv6 link-local address", ifname)
	return ""
}

// hostGets is a positive control: the node gets an answer containing want from url.
func hostGets(t *testing.T, url, want string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("positive control: the node cannot get %s: %v", url, err)
		return false
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), want) {
		t.Errorf("positive control: %s from the node answered %q, want %q", url, body, want)
		return false
	}
	return true
}

// hostDials is a positive control: something listens at addr, seen from the node. IPv4
// connections come from the node IP: the node's guard drops what comes from the pod CIDR, and
// the node's own address on the pod bridge is in it.
func hostDials(t *testing.T, addr string) bool {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if host, _, _ := net.SplitHostPort(addr); net.ParseIP(host).To4() != nil {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(nodeIP)}
	}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Errorf("positive control: nothing answers at %s on the node: %v", addr, err)
		return false
	}
	conn.Close()
	return true
}

// listenOnAllNodeAddresses serves on a free port of every address of the node (IPv4 and IPv6,
// the pod gateway included), as a node daemon bound to the wildcard address does, and returns
// the port. It answers what connects; the test shows jobs cannot connect.
func listenOnAllNodeAddresses(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "node") })}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	return l.Addr().(*net.TCPAddr).Port
}

// webhookServiceAddr is the ClusterIP:port of agent-sandbox's webhook Service, which the API
// server calls through kube-proxy; the controller pod behind it is no job's business.
func webhookServiceAddr(t *testing.T, c *clusterjobs.Cluster) string {
	t.Helper()
	svc, err := c.Admin.Kube.CoreV1().Services("agent-sandbox-system").Get(context.Background(), "agent-sandbox-webhook-service", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(svc.Spec.Ports) == 0 {
		t.Fatalf("Service agent-sandbox-system/%s has no port", svc.Name)
	}
	return net.JoinHostPort(svc.Spec.ClusterIP, fmt.Sprint(svc.Spec.Ports[0].Port))
}
