//go:build security

package security

import (
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/helmchart"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/chartinstall"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
)

// agentPortsProbe is the job's side of TestJobCannotSendFromTheAgentsPorts, in node (libuv
// binds TCP sockets with SO_REUSEADDR, for a server and for a client's local port alike: what a
// job would set to share a port). For each port it tries to listen on every address of the
// pod's interfaces and on both wildcards, and to connect to TARGET from the pod's address on
// that port, and prints one line per attempt: "@bind HOST PORT RESULT" and
// "@connect HOST PORT RESULT", RESULT an error code (EADDRINUSE, ...), "bound" or "connected".
const agentPortsProbe = `cat > /tmp/agentports.js <<'EOF'
const net = require("net"), os = require("os");
const [target, targetPort, ...ports] = process.argv.slice(2);
const hosts = ["0.0.0.0", "::"];
for (const [name, list] of Object.entries(os.networkInterfaces()))
  for (const a of list) hosts.push(a.family === "IPv6" && a.address.startsWith("fe80") ? a.address + "%%" + name : a.address);
const podIP = os.networkInterfaces().eth0.find(a => a.family === "IPv4").address;
console.log("@podip " + podIP);
const listen = (host, port) => new Promise(done => {
  const s = net.createServer();
  s.once("error", e => done(e.code || String(e)));
  s.listen({host, port: +port, exclusive: true}, () => s.close(() => done("bound")));
});
const connect = (host, port) => new Promise(done => {
  const s = net.connect({host: target, port: +targetPort, localAddress: host, localPort: +port, timeout: 3000});
  s.once("connect", () => { s.destroy(); done("connected"); });
  s.once("timeout", () => { s.destroy(); done("timeout"); });
  s.once("error", e => done(e.code || String(e)));
});
(async () => {
  for (const port of ports) {
    for (const host of hosts) console.log("@bind " + host + " " + port + " " + await listen(host, port));
    console.log("@connect " + podIP + " " + port + " " + await connect(podIP, port));
  }
})();
EOF
node /tmp/agentports.js %s %d %s
`

var probeLineRe = regexp.MustCompile(`(?m)^@(bind|connect) (\S+) (\d+) (\S+)$`)

// TestJobCannotSendFromTheAgentsPorts: the netstack fence lets packets out from the agent's
// ports (wire.NetworkPort 7543, wire.FencePort 7544) to the reply-to networks, so that the agent
// can answer its clients; gVisor lets a socket with SO_REUSEADDR bind the pod's address, or
// loopback, on a port a wildcard listener holds. The agent therefore listens on its ports of each
// of the pod's addresses too. A job of a fenced pool tries to take them: listen on every address
// of the pod (the pod's IP, loopback, IPv6 link-local, the wildcards), and connect to a listener
// on the node, inside the reply-to network, from the pod's IP on each port. Every attempt must
// fail with EADDRINUSE, and the node's listener must see no connection from those ports. The
// same attempts on a port the agent does not hold (7545) bind, which shows the probe can.
func TestJobCannotSendFromTheAgentsPorts(t *testing.T) {
	t.Parallel()
	c := clusterjobs.Connect(t)
	requireNetstackFence(t, c, localcluster.Template)
	r := c.NewRunner(t, "sec-agentports", "")
	job := prepared(t, r, clusterjobs.JobSpec{})

	target := listenOnNode(t)
	targetPort := target.port

	const freePort = 7545
	held := []int{wire.NetworkPort, wire.FencePort}
	ports := strings.Trim(fmt.Sprint(append(slices.Clone(held), freePort)), "[]")
	// The agent serves both of its ports in this pod: otherwise the fence is misconfigured and
	// this test would prove nothing about the agent.
	out := job.MustRun(t, fmt.Sprintf(`for p in %d %d; do curl -sk -o /dev/null --max-time 3 "http://127.0.0.1:$p/"; echo "@agent $p rc=$?"; done
`, wire.NetworkPort, wire.FencePort)+fmt.Sprintf(agentPortsProbe, podGateway, targetPort, ports)).Stdout
	for _, p := range held {
		// curl exit 7 is "connection refused": nothing listens.
		if strings.Contains(out, fmt.Sprintf("@agent %d rc=7", p)) {
			t.Fatalf("the agent does not listen on port %d in pod %s: the template's fence relies on it\n%s", p, job.Pod, out)
		}
	}
	podIP := job.PodObject(t).Status.PodIP
	if !strings.Contains(out, "@podip "+podIP) {
		t.Fatalf("the job's probe did not run from pod IP %s:\n%s", podIP, out)
	}

	tried := map[string]bool{}
	for _, m := range probeLineRe.FindAllStringSubmatch(out, -1) {
		kind, host, port, result := m[1], m[2], m[3], m[4]
		p, _ := strconv.Atoi(port)
		tried[kind+" "+host+" "+port] = true
		switch {
		case slices.Contains(held, p) && result != "EADDRINUSE":
			t.Errorf("the job could %s %s port %d beside the agent: %s, want EADDRINUSE", kind, host, p, result)
		case p == freePort && kind == "bind" && result != "bound" && result != "EADDRNOTAVAIL":
			// A tentative IPv6 address may not be bindable yet; anything else says the probe is broken.
			t.Errorf("control: the job could not bind %s port %d, which the agent does not hold: %s", host, p, result)
		case p == freePort && kind == "connect" && result == "EADDRINUSE":
			t.Errorf("control: connecting from %s port %d: %s; the probe cannot tell a held port", host, p, result)
		}
	}
	for _, p := range append(slices.Clone(held), freePort) {
		for _, want := range []string{"bind 0.0.0.0", "bind ::", "bind " + podIP, "bind 127.0.0.1", "connect " + podIP} {
			if !tried[want+" "+strconv.Itoa(p)] {
				t.Errorf("the job's probe has no line for %s port %d:\n%s", want, p, out)
			}
		}
	}
	if t.Failed() {
		t.Logf("the job's output:\n%s", out)
	}

	time.Sleep(time.Second) // a connection that made it is accepted by now
	for _, addr := range target.accepted() {
		_, port, _ := net.SplitHostPort(addr)
		if p, _ := strconv.Atoi(port); slices.Contains(held, p) {
			t.Errorf("the node's listener %s:%d accepted a connection from %s: a job sent from the agent's port", podGateway, targetPort, addr)
		}
	}
}

// nodeListener is a TCP listener on the node's pod-network address (the pod gateway, inside the
// reply-to network 10.88.0.0/16) that records where its connections come from.
type nodeListener struct {
	port int
	mu   sync.Mutex
	from []string
}

// listenOnNode starts a nodeListener on a free port; it closes when the test ends.
func listenOnNode(t *testing.T) *nodeListener {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(podGateway, "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	l := &nodeListener{port: ln.Addr().(*net.TCPAddr).Port}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			l.mu.Lock()
			l.from = append(l.from, conn.RemoteAddr().String())
			l.mu.Unlock()
			conn.Close()
		}
	}()
	return l
}

// accepted is where the connections accepted so far came from (HOST:PORT each).
func (l *nodeListener) accepted() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.from)
}

// TestJobCannotSendFromTheAgentsPortsWithoutAgentTLS: with agentTLS.enabled false, job pods get
// no agent CA and the agent does not listen on wire.NetworkPort (7543): any job process may bind
// it. The netstack fence must then write no reply rule for it; before issue 39 the chart's fence
// wrote one for 7543 and 7544 whatever the agent served, and a job that bound :7543 could
// connect to anything in replyTo. The pool's template is deploy/local's duo-gvisor as the chart
// renders it with agentTLS.enabled=false (noAgentTLSTemplate). Its NetworkPolicy lets the job
// reach two listeners of the node, inside replyTo, so that the netstack fence alone decides, as
// while the node's policy agent restarts; the fence allows the control listener (an --allow
// added to its args) and not the target. The job binds 7543 (nothing holds it: it binds) and
// connects from POD-IP:7543 to the target: refused at once by the fence's reset, and the target
// sees nothing. It tries 7544 too, which the agent still holds on every address (EADDRINUSE), and
// 7545 (no rule either: refused). Controls: the agent answers on 7544 and not on 7543, and a
// connect to the control listener, which the fence lets out, is not refused but times out (the
// local node drops connections pods open to it), so a refusal is the fence's.
func TestJobCannotSendFromTheAgentsPortsWithoutAgentTLS(t *testing.T) {
	t.Parallel()
	c := clusterjobs.Connect(t)
	requireNetstackFence(t, c, localcluster.Template)
	target, control := listenOnNode(t), listenOnNode(t)
	const name = "sec-agentports-notls"
	tmpl := noAgentTLSTemplate(t, c, name)
	fence := initContainer(t, tmpl, netfenceContainer)
	fence.Args = append(fence.Args, "--allow", fmt.Sprintf("%s/32:%d", podGateway, control.port))
	if tmpl.Spec.NetworkPolicy == nil {
		t.Fatalf("the chart's %s has no networkPolicy", localcluster.Template)
	}
	tmpl.Spec.NetworkPolicy.Egress = append(tmpl.Spec.NetworkPolicy.Egress, networkingv1.NetworkPolicyEgressRule{
		To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: podGateway + "/32"}}},
		Ports: []networkingv1.NetworkPolicyPort{
			{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(int32(target.port)))},
			{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(int32(control.port)))},
		},
	})
	pool := warmPool(t, c, tmpl, 1)
	r := c.NewRunnerWith(t, name, localcluster.Config{
		Pools: append([]localcluster.PoolConfig{{Name: pool, Images: []string{localcluster.CIImage}}}, localcluster.Pools(localcluster.Pool)[1:]...),
	})
	job := prepared(t, r, clusterjobs.JobSpec{})

	const freePort, controlFrom = 7545, 7546
	tried := []int{wire.NetworkPort, wire.FencePort, freePort}
	out := job.MustRun(t, fmt.Sprintf(`for p in %d %d; do curl -s -o /dev/null --max-time 3 "http://127.0.0.1:$p/"; echo "@agent $p rc=$?"; done
`, wire.NetworkPort, wire.FencePort)+
		fmt.Sprintf(agentPortsProbe, podGateway, target.port, strings.Trim(fmt.Sprint(tried), "[]"))+
		fmt.Sprintf(agentPortsProbe, podGateway, control.port, strconv.Itoa(controlFrom))).Stdout
	defer func() {
		if t.Failed() {
			t.Logf("the job's output:\n%s", out)
		}
	}()
	// curl exit 7 is "connection refused": nothing listens.
	if !strings.Contains(out, fmt.Sprintf("@agent %d rc=7", wire.NetworkPort)) {
		t.Fatalf("something answers on port %d in pod %s, which has no agent CA: this is not the case under test", wire.NetworkPort, job.Pod)
	}
	if strings.Contains(out, fmt.Sprintf("@agent %d rc=7", wire.FencePort)) || !strings.Contains(out, fmt.Sprintf("@agent %d rc=", wire.FencePort)) {
		t.Fatalf("the agent does not answer on port %d in pod %s", wire.FencePort, job.Pod)
	}
	podIP := job.PodObject(t).Status.PodIP
	results := map[string]string{}
	for _, m := range probeLineRe.FindAllStringSubmatch(out, -1) {
		results[m[1]+" "+m[2]+" "+m[3]] = m[4]
	}
	// The control first. The local node drops every connection a pod opens to it (SBX-INPUT,
	// tests/cluster: a hardened node), so a connect the netstack fence lets out times out, and one
	// it refuses meets the table's reset at once (ECONNREFUSED): the fence allows the control
	// listener, and from an unheld port the connect must time out, not be refused.
	if got := results[fmt.Sprintf("connect %s %d", podIP, controlFrom)]; got != "timeout" {
		t.Fatalf("control: from %s:%d to %s:%d, which the fence allows and the node drops: %q, want timeout; the refusals below would not tell the fence's answer", podIP, controlFrom, podGateway, control.port, got)
	}

	for _, p := range tried {
		bind, connect := results[fmt.Sprintf("bind 0.0.0.0 %d", p)], results[fmt.Sprintf("connect %s %d", podIP, p)]
		switch p {
		case wire.FencePort:
			// Held by the agent on every address, as in TestJobCannotSendFromTheAgentsPorts.
			if bind != "EADDRINUSE" || connect != "EADDRINUSE" {
				t.Errorf("port %d: bind %q, connect %q; want EADDRINUSE for both: the agent holds it", p, bind, connect)
			}
		default:
			// Free: the job binds it, and the fence refuses its connect with the table's reset
			// (ECONNREFUSED); a timeout is a connect the fence let out (see the control).
			if bind != "bound" {
				t.Errorf("port %d: bind 0.0.0.0 %q; want bound (nothing holds it here)", p, bind)
			}
			if connect != "ECONNREFUSED" {
				t.Errorf("from %s:%d to %s:%d in replyTo: %q; want ECONNREFUSED, the fence's refusal: a reply rule let it out", podIP, p, podGateway, target.port, connect)
			}
		}
	}
	for _, addr := range target.accepted() {
		t.Errorf("the node's listener %s:%d, which only a reply rule could open, accepted a connection from %s", podGateway, target.port, addr)
	}
}

// noAgentTLSTemplate is deploy/local's template localcluster.Template as the chart renders it
// with agentTLS.enabled=false (as tests/cluster/up.sh renders it otherwise: release and
// namespace sandbox-executor, the agent image the cluster's template runs), named name. It fails
// the test unless the cluster runs this branch's chart and the rendered template is the case under
// test: no agent CA in the job container, and a netstack fence that replies from 7544 alone.
func noAgentTLSTemplate(t *testing.T, c *clusterjobs.Cluster, name string) *extv1beta1.SandboxTemplate {
	t.Helper()
	live, err := c.Admin.Extensions.ExtensionsV1beta1().SandboxTemplates(clusterjobs.Namespace).Get(t.Context(), localcluster.Template, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	liveFence := initContainer(t, live, netfenceContainer)
	if !slices.Contains(liveFence.Args, "--reply-port") {
		t.Fatalf("SandboxTemplate %s's netfence args %q name no --reply-port: apply this branch's deploy/local (make cluster-up)", localcluster.Template, liveFence.Args)
	}
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	helm, err := chartinstall.Helm(root)
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := chartinstall.Output(helm, "template", clusterjobs.Namespace, filepath.Join(root, "deploy", "chart", "sandbox-executor"),
		"--namespace", clusterjobs.Namespace, "-f", filepath.Join(root, "deploy", "local", "values.yaml"),
		"--set", "images.agent="+liveFence.Image, "--set", "agentTLS.enabled=false", "--show-only", "templates/sandboxtemplates.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := helmchart.Parse([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	var tmpl extv1beta1.SandboxTemplate
	objs.Decode(t, "SandboxTemplate", localcluster.Template, &tmpl)
	fence := initContainer(t, &tmpl, netfenceContainer)
	if i := slices.Index(fence.Args, "--reply-port"); i < 0 || i+1 >= len(fence.Args) || fence.Args[i+1] != strconv.Itoa(wire.FencePort) ||
		slices.Contains(fence.Args, strconv.Itoa(wire.NetworkPort)) {
		t.Fatalf("with agentTLS.enabled=false the chart renders netfence %q; want --reply-port %d and no %d", fence.Args, wire.FencePort, wire.NetworkPort)
	}
	for _, e := range tmpl.Spec.PodTemplate.Spec.Containers[0].Env {
		if e.Name == wire.ClientCAEnv {
			t.Fatalf("with agentTLS.enabled=false the chart still gives the job container %s", wire.ClientCAEnv)
		}
	}
	tmpl.Name, tmpl.Namespace = name, clusterjobs.Namespace
	if tmpl.Labels == nil {
		tmpl.Labels = map[string]string{}
	}
	tmpl.Labels[suiteLabel] = "true"
	return &tmpl
}

// initContainer is the template's init container name; it fails the test if there is none.
func initContainer(t *testing.T, tmpl *extv1beta1.SandboxTemplate, name string) *corev1.Container {
	t.Helper()
	containers := tmpl.Spec.PodTemplate.Spec.InitContainers
	for i := range containers {
		if containers[i].Name == name {
			return &containers[i]
		}
	}
	t.Fatalf("SandboxTemplate %s has no %s init container", tmpl.Name, name)
	return nil
}
