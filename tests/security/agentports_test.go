//go:build security

package security

import (
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
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

	// A listener on the node's pod-network address (the pod gateway, inside the reply-to network
	// 10.88.0.0/16) that records where its connections come from.
	ln, err := net.Listen("tcp", net.JoinHostPort(podGateway, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var mu sync.Mutex
	var from []string
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			from = append(from, conn.RemoteAddr().String())
			mu.Unlock()
			conn.Close()
		}
	}()
	targetPort := ln.Addr().(*net.TCPAddr).Port

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
	mu.Lock()
	defer mu.Unlock()
	for _, addr := range from {
		_, port, _ := net.SplitHostPort(addr)
		if p, _ := strconv.Atoi(port); slices.Contains(held, p) {
			t.Errorf("the node's listener %s:%d accepted a connection from %s: a job sent from the agent's port", podGateway, targetPort, addr)
		}
	}
}
