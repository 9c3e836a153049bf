//go:build security

package security

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/egress"
	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
)

const (
	// tunnelsWanted is how many CONNECT tunnels the hostile job asks for.
	tunnelsWanted = 10000
	// tunnelsNoCap is how many tunnels held at once show a proxy without a per-client cap: the
	// job stops asking there, to spare the shared proxy and this machine thousands of upstream
	// connections from an old proxy.
	tunnelsNoCap = 1024
	// tunnelTargetBody is what the flood's target (tunnelInstance) answers every request with.
	tunnelTargetBody = "tunnel-target"
)

// tunnelInstance is the flood's target: an instance of the test's own on the instance network
// (localcluster.ListenOnInstanceNetwork), which its pool grants, answering every request with
// tunnelTargetBody until the test ends. deploy/local's "GitLab instance" (10.99.1.2) is a small
// python server that every pod's readiness check and other tests' positive controls reach: the
// flood must not hold hundreds of its connections. It returns the instance's host:port.
func tunnelInstance(t *testing.T) string {
	t.Helper()
	listener, err := localcluster.ListenOnInstanceNetwork()
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, tunnelTargetBody)
	})}
	go func() { _ = srv.Serve(listener) }()
	t.Cleanup(func() { _ = srv.Close() }) // closes the listener, which releases its address
	return listener.Addr().String()
}

// tunnelFlood opens CONNECT tunnels to target through the proxy, 200 in flight at a time,
// holds every one the proxy establishes, prints one "@tunnels" line of counts, and keeps them
// until /tmp/release exists (at most 5 minutes). The proxy's cap is on tunnels open at once, and
// a held tunnel can end on its own (the upstream may drop some of a burst of connections), which
// frees its place: so the line counts the most tunnels open at once (max-open) besides those
// established in all and those that ended while held (ended).
func tunnelFlood(target string) string {
	return fmt.Sprintf(`const net = require('net'), fs = require('fs');
const want = %d, noCap = %d, inFlight = 200, held = [];
let asked = 0, pending = 0, established = 0, open = 0, maxOpen = 0, ended = 0, refused = 0, other = 0, firstOther = '';
const done = () => {
  console.log('@tunnels max-open=' + maxOpen + ' open=' + open + ' established=' + established + ' ended=' + ended + ' refused=' + refused + ' other=' + other + ' asked=' + asked + ' first-other=' + JSON.stringify(firstOther));
  const t0 = Date.now(), hold = setInterval(() => {
    if (fs.existsSync('/tmp/release') || Date.now() - t0 > 300000) { clearInterval(hold); held.forEach(s => s.destroy()); }
  }, 200);
};
const next = () => {
  while (pending < inFlight && asked < want && maxOpen <= noCap) {
    asked++; pending++;
    const s = net.connect(3128, '10.99.2.2');
    let answer = '', settled = '';
    const settle = (kind, what) => {
      if (settled) return; settled = kind; pending--;
      if (kind === 'established') { established++; open++; maxOpen = Math.max(maxOpen, open); held.push(s); } else { s.destroy(); }
      if (kind === 'refused') refused++;
      if (kind === 'other') { other++; if (!firstOther) firstOther = what; }
      if (pending === 0 && (asked >= want || maxOpen > noCap)) done(); else next();
    };
    s.on('connect', () => s.write('CONNECT %[3]s HTTP/1.1\r\nHost: %[3]s\r\n\r\n'));
    s.on('data', d => {
      if (settled) return;
      answer += d.toString();
      if (!answer.includes('\r\n')) return;
      const status = answer.split(' ')[1];
      settle(status === '200' ? 'established' : status === '429' ? 'refused' : 'other', answer.split('\r\n')[0]);
    });
    s.on('error', e => settle('other', e.code));
    s.on('close', () => { if (settled === 'established') { open--; ended++; } else settle('other', 'closed: ' + answer.split('\r\n')[0]); });
  }
};
next();
`, tunnelsWanted, tunnelsNoCap, target)
}

var tunnelCounts = regexp.MustCompile(`@tunnels max-open=(\d+) open=(\d+) established=(\d+) ended=(\d+) refused=(\d+) other=(\d+) asked=(\d+) first-other=(.*)`)

// TestTenThousandTunnelsDoNotStarveAnotherJob: a proxied job asks the egress proxy for 10,000
// CONNECT tunnels to an instance its pool grants and holds what it gets; the proxy must
// establish no more than its per-client cap (deploy/local/egress-proxy.toml's
// max_tunnels_per_client) and refuse the rest with 429, recorded as blocked (the job log names
// them), while another proxied job's request to the same instance through the same proxy
// succeeds. The instance is the test's own (tunnelInstance), so the flood reaches no server
// other tests use. A proxy that establishes more than the cap is an older binary than the fix:
// tests/cluster/egress-proxy.sh builds it from the repository cluster-up ran from, and the test
// says so.
func TestTenThousandTunnelsDoNotStarveAnotherJob(t *testing.T) {
	t.Parallel()
	limit := proxyTunnelCap(t)
	c := clusterjobs.Connect(t)
	target := tunnelInstance(t)
	r := c.NewRunnerWith(t, "sec-tunnels", localcluster.Config{ReadyTimeout: "5m", Pools: proxiedPools(egressAdmin, target)})
	hog := prepared(t, r, clusterjobs.JobSpec{NoImage: true})
	other := prepared(t, r, clusterjobs.JobSpec{NoImage: true})
	hogIP := hog.PodObject(t).Status.PodIP

	live := clusterjobs.NewLive("@tunnels")
	cmd := hog.Command("run", hog.Script(t, "ulimit -n 20000 2>/dev/null\ncat >/tmp/tunnels.js <<'EOF'\n"+tunnelFlood(target)+"EOF\nnode /tmp/tunnels.js\n"), "build_script")
	cmd.Stdout, cmd.Stderr = live, live
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	release := func() { _, _ = c.Exec(context.Background(), hog.Pod, "touch", "/tmp/release") }
	t.Cleanup(func() { release(); _ = cmd.Wait() })
	if !live.Wait("@tunnels", 5*time.Minute) {
		t.Fatalf("the tunnel flood did not finish asking within 5 minutes:\n%s", live)
	}
	m := tunnelCounts.FindStringSubmatch(live.String())
	if m == nil {
		t.Fatalf("no counts in the flood's output:\n%s", live)
	}
	maxOpen, open, established, ended, refused, others, asked := atoi(t, m[1]), atoi(t, m[2]), atoi(t, m[3]), atoi(t, m[4]), atoi(t, m[5]), atoi(t, m[6]), atoi(t, m[7])
	t.Logf("hog %s asked for %d tunnels: at most %d open at once, %d established in all (%d ended while held), %d refused with 429, %d otherwise (first: %s); %d open when the other job asks",
		hogIP, asked, maxOpen, established, ended, refused, others, m[8], open)

	// While the hog holds its tunnels, the other job reaches the same instance through the
	// proxy, forwarded and tunnelled.
	res := other.MustRun(t, `echo "forwarded=$(curl -sS --max-time 20 http://`+target+`/)"
echo "tunnelled=$(curl -sS -p --max-time 20 http://`+target+`/)"
`)
	for _, want := range []string{"forwarded=" + tunnelTargetBody, "tunnelled=" + tunnelTargetBody} {
		if !strings.Contains(res.Stdout, want) {
			t.Errorf("the other job's request through the proxy failed while the hog held %d tunnels: want %q in\n%s", maxOpen, want, res.Output())
		}
	}

	if maxOpen > limit {
		t.Fatalf("the proxy held %d tunnels of one pod open at once, over max_tunnels_per_client %d: the running proxy predates the cap (cluster-up builds it from the repository it runs from; re-run it from this branch)", established, limit)
	}
	if maxOpen != limit || refused == 0 || refused != asked-established || others != 0 {
		t.Errorf("of %d tunnels asked: at most %d open at once, %d established, %d refused with 429, %d otherwise; want %d open at once and every other one refused", asked, maxOpen, established, refused, others, limit)
	}
	want := "CONNECT " + target + ": " + adminclient.ReasonTooManyTunnels
	if blocked := blockedAttempts(t, hogIP); !slices.Contains(blocked, want) {
		t.Errorf("the proxy's blocked attempts of the hog %s: %q; want %q", hogIP, blocked, want)
	}
	release()
	if err := cmd.Wait(); err != nil {
		t.Errorf("the hog's stage: %v\n%s", err, live)
	}
	if !strings.Contains(live.String(), "egress blocked: CONNECT "+target) {
		t.Errorf("the hog's job log does not name the refused tunnels:\n%s", tail(live.String()))
	}
}

// proxyTunnelCap is the per-client tunnel cap of the local proxy's configuration.
func proxyTunnelCap(t *testing.T) int {
	t.Helper()
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := egress.LoadConfig(filepath.Join(root, "deploy", "local", "egress-proxy.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if n := cfg.Config.MaxTunnelsPerClient; n > 0 {
		return n
	}
	return egress.DefaultMaxTunnelsPerClient
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// tail is the end of a long output, for messages.
func tail(s string) string {
	if i := bytes.LastIndexByte([]byte(s[:max(0, len(s)-2000)]), '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
