//go:build security

package security

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/packetcapture"
)

const (
	// netfenceContainer is the init container that sets the pod's netstack iptables.
	netfenceContainer = "netfence"
	// outsideLink is the node's side of "the internet"'s network namespace: every packet that
	// reaches 10.99.0.2 crosses it (tests/cluster/networkpolicy.sh).
	outsideLink = "sbx-out0"
	// proxiedTemplate and proxiedPool are deploy/local's pool whose pods may reach only the
	// egress proxy (10.99.2.2:3128).
	proxiedTemplate = "duo-gvisor-proxied"
	proxiedPoolName = "duo-proxied"
	proxyAdmin      = localcluster.EgressAdminAddr
	// fenceRounds is how many times the policy agent is restarted around a job's start. The
	// rounds split the lapse's window of starts (lapseEarliest to lapseLatest around the jobs'
	// start) into as many equal strata and draw one start in each, so every phase of a job's
	// start (claim, fence check, first stage, a running script) sees a lapse in every run. Each
	// round waits for the proxied pool's one warm pod to be refilled (about 50 s on a loaded
	// 2-core node), which is what bounds the count.
	fenceRounds   = 6
	lapseEarliest = -1500 * time.Millisecond
	lapseLatest   = 3 * time.Second
)

// TestNetstackFenceHoldsThroughPolicyAgentRestarts takes the node's NetworkPolicy enforcement
// down (kube-router stopped and its rules removed, as a crashed, upgraded or re-syncing agent
// leaves a node) at a random moment around a job's start, holds it down for a random while, and
// brings it back, fenceRounds times (one start drawn in each stratum of the window). In every
// round a job of the direct pool and one of the proxied pool curl "the internet" in a loop across
// the lapse. The second fence, the iptables
// their fence-init container set in gVisor's own network stack, must hold: not one packet of
// theirs reaches 10.99.0.2 (tcpdump on the link in front of it), while a canary pod that only
// NetworkPolicy fences reaches it in every round, which proves each lapse was real. After each
// lapse the GitLab instance is reachable again: directly from the direct pool, through the
// proxy from the proxied one.
//
// SANDBOX_EXECUTOR_FENCE_SEED replays a run's schedule (the seed is logged).
func TestNetstackFenceHoldsThroughPolicyAgentRestarts(t *testing.T) {
	c := clusterjobs.Connect(t)
	requireNetstackFence(t, c, localcluster.Template)
	requireNetstackFence(t, c, proxiedTemplate)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("SANDBOX_EXECUTOR_FENCE_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("SANDBOX_EXECUTOR_FENCE_SEED=%q: not an unsigned integer", s)
		}
		seed = v
	}
	t.Logf("schedule seed %d (SANDBOX_EXECUTOR_FENCE_SEED=%d replays it)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0))

	packets := packetcapture.To(t, outsideLink, internet)
	canaryIP := startCanary(t, c)
	direct := c.NewRunner(t, "sec-nsfence", "require_fence = true")
	proxied := c.NewRunnerWith(t, "sec-nsfence-px", localcluster.Config{
		Pools: append([]localcluster.PoolConfig{{Name: proxiedPoolName, EgressProxy: proxyAdmin}}, localcluster.Pools(localcluster.Pool)...),
		Extra: "require_fence = true",
	})
	clusterjobs.RestoreAfterBreak(t, func() error { return clusterjobs.RunScript("networkpolicy.sh", "up") })

	// The canary's policy is programmed before the first round: it reaches nothing.
	fencedFrom := packets.FencedAgain(t, canaryIP, time.Now(), 3*time.Second)
	jobIPs := map[string]string{}
	var lapses []window
	for round := 1; round <= fenceRounds; round++ {
		offset := lapseStart(rng, round)
		hold := time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))
		t.Logf("round %d: enforcement down %s after the jobs start, for %s", round, offset, hold)
		lapse := fenceRound(t, direct, proxied, offset, hold, jobIPs)
		// The policy agent says it has synced before every rule is in place: the canary's last
		// packet tells when enforcement really came back.
		lapse.restored = packets.FencedAgain(t, canaryIP, lapse.restored, 3*time.Second)
		if n := packets.From(canaryIP, lapse.begin, lapse.restored); n == 0 {
			t.Fatalf("round %d: the canary %s reached %s not once while enforcement was down (%s to %s): the fault did not open the NetworkPolicy layer, so this round proved nothing",
				round, canaryIP, internet, lapse.begin.Format(time.RFC3339Nano), lapse.restored.Format(time.RFC3339Nano))
		}
		lapses = append(lapses, lapse)
	}
	time.Sleep(time.Second) // tcpdump's last lines
	// NetworkPolicy holds the canary whenever it is enforced: what it let through came in the
	// lapses. Not quite always: kube-router, back up, resyncs its rules again a while later, and
	// a canary attempt (it tries ten times a second) may pass in that moment (one packet in
	// 2,894 did, in one run of make check). A canary that NetworkPolicy does not fence at all
	// passes ten times a second all through the test: more than one packet a round outside the
	// lapses says so.
	outside := packets.From(canaryIP, fencedFrom.Add(time.Nanosecond), time.Now())
	for _, l := range lapses {
		outside -= packets.From(canaryIP, l.begin, l.restored)
	}
	if outside > fenceRounds {
		t.Errorf("the canary %s reached %s %d times while NetworkPolicy was enforced: it is not fenced by the template's policy, so it proves no lapse", canaryIP, internet, outside)
	} else if outside > 0 {
		t.Logf("the canary reached %s %d times outside the lapses this test caused: the policy agent's own resync after coming back", internet, outside)
	}
	for ip, job := range jobIPs {
		if n := packets.From(ip, time.Time{}, time.Now()); n != 0 {
			t.Errorf("%s (%s) sent %d packets that reached %s", job, ip, n, internet)
		}
	}
	t.Logf("%d rounds: the canary reached %s %d times, all during the lapses; the jobs' pods (%d) never", fenceRounds, internet, packets.From(canaryIP, time.Time{}, time.Now()), len(jobIPs))
}

type window struct{ begin, end, restored time.Time }

// lapseStart draws when round's lapse begins, relative to its jobs' start: uniformly within the
// round's stratum of [lapseEarliest, lapseLatest).
func lapseStart(rng *rand.Rand, round int) time.Duration {
	stratum := (lapseLatest - lapseEarliest) / fenceRounds
	return lapseEarliest + time.Duration(round-1)*stratum + time.Duration(rng.Int64N(int64(stratum)))
}

// fenceRound runs one job on each runner while enforcement goes down offset after they start
// and comes back hold later; once it is back, each job reaches the GitLab instance on its pool's
// route. It returns when the lapse was and records the jobs' pod IPs.
func fenceRound(t *testing.T, direct, proxied *clusterjobs.Runner, offset, hold time.Duration, jobIPs map[string]string) window {
	t.Helper()
	var lapse window
	restored := make(chan struct{})
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	wg.Go(func() {
		defer close(restored)
		time.Sleep(time.Until(start.Add(offset - lapseEarliest)))
		lapse.begin = time.Now()
		if err := clusterjobs.RunScript("networkpolicy.sh", "enforcement-down"); err != nil {
			t.Error(err)
		}
		time.Sleep(hold)
		lapse.end = time.Now()
		if err := clusterjobs.RunScript("networkpolicy.sh", "up"); err != nil {
			t.Error(err)
		}
		lapse.restored = time.Now()
	})
	time.Sleep(-lapseEarliest) // offset is counted from here, and may be negative
	for _, r := range []struct {
		runner   *clusterjobs.Runner
		spec     clusterjobs.JobSpec
		instance string // the GitLab instance on the pool's route
	}{
		{direct, clusterjobs.JobSpec{}, "curl -sS --noproxy '*' --max-time 10 http://" + gitlab + "/"},
		// No image: the proxied runner's default pool; the CI image would go to duo-default.
		{proxied, clusterjobs.JobSpec{NoImage: true}, "curl -sS --max-time 20 http://gitlab.sandbox.test/"},
	} {
		wg.Go(func() {
			j := r.runner.NewJob(t, r.spec)
			defer j.Cleanup(t)
			if !j.TryPrepare(t) {
				return
			}
			pod, err := r.runner.Admin.Kube.CoreV1().Pods(clusterjobs.Namespace).Get(context.Background(), j.Pod, metav1.GetOptions{})
			if err != nil {
				t.Errorf("job %d: its pod: %v", j.ID, err)
				return
			}
			mu.Lock()
			jobIPs[pod.Status.PodIP] = fmt.Sprintf("job %d (pod %s)", j.ID, pod.Name)
			mu.Unlock()
			// Tries "the internet" every 200 ms, bypassing any proxy, for 8 s: across the lapse.
			res := j.Run(t, `end=$(($(date +%s) + 8))
while [ "$(date +%s)" -lt "$end" ]; do
  curl -s --noproxy '*' --connect-timeout 1 --max-time 1 http://`+internet+`/ && echo " REACHED"
  sleep 0.2
done
echo loop-done
`)
			if strings.Contains(res.Output(), "REACHED") || !strings.Contains(res.Output(), "loop-done") {
				t.Errorf("job %d (pod %s): the loop reached the internet or did not finish:\n%s", j.ID, pod.Name, res.Output())
			}
			<-restored
			if res := j.Run(t, r.instance); res.ExitCode != 0 || !strings.Contains(res.Output(), "gitlab") {
				t.Errorf("job %d (pod %s): the GitLab instance is not reachable once enforcement is back (exit %d):\n%s", j.ID, pod.Name, res.ExitCode, res.Output())
			}
		})
	}
	wg.Wait()
	return lapse
}

// TestNetstackFenceRefusesDeniedTCPAtOnce: the fenced pool's table answers a denied TCP connect
// with a reset from inside the sandbox, so a job's curl to "the internet" fails at once with
// "connection refused" (exit 7) instead of waiting for its connect timeout, and the packet never
// leaves the pod. (The agent's fence check meets the same reset for its canary, which is what
// keeps prepare off the 250 ms timeout.)
func TestNetstackFenceRefusesDeniedTCPAtOnce(t *testing.T) {
	t.Parallel()
	c := clusterjobs.Connect(t)
	requireNetstackFence(t, c, localcluster.Template)
	packets := packetcapture.To(t, outsideLink, internet)
	r := c.NewRunner(t, "sec-nsfence-reject", "")
	job := prepared(t, r, clusterjobs.JobSpec{})
	pod := job.PodObject(t)
	// What the netfence container wrote: a runsc without the REJECT target (gVisor
	// a81fd9dd382e) gets the dropping table, whose denied connects wait for their timeout.
	line, err := c.Admin.Kube.CoreV1().Pods(clusterjobs.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: netfenceContainer}).DoRaw(t.Context())
	if err != nil {
		t.Fatalf("the netfence container's log: %v", err)
	}
	if strings.Contains(string(line), "no REJECT target") {
		t.Skipf("this cluster's runsc has no REJECT target (tests/cluster/lib.sh GVISOR_VERSION): %s", line)
	}
	if !strings.Contains(string(line), "other tcp is refused at once") {
		t.Fatalf("the netfence container's log does not say tcp is refused: %q", line)
	}
	out := job.MustRun(t, `for i in 1 2 3; do
  s=$(date +%s%N); curl -s --noproxy '*' --connect-timeout 5 -o /dev/null http://`+internet+`/; rc=$?; e=$(date +%s%N)
  echo "@curl rc=$rc ms=$(( (e - s) / 1000000 ))"
done
`).Output()
	tries := regexp.MustCompile(`@curl rc=(\d+) ms=(\d+)`).FindAllStringSubmatch(out, -1)
	if len(tries) != 3 {
		t.Fatalf("the job's output has %d of 3 tries:\n%s", len(tries), out)
	}
	for _, m := range tries {
		if ms, _ := strconv.Atoi(m[2]); m[1] != "7" || ms > 1000 {
			t.Errorf("curl to %s: exit %s after %s ms; want 7 (refused) at once, from the pod's own table", internet, m[1], m[2])
		}
	}
	time.Sleep(time.Second) // tcpdump's last lines
	if n := packets.From(pod.Status.PodIP, time.Time{}, time.Now()); n != 0 {
		t.Errorf("pod %s (%s) sent %d packets that reached %s", pod.Name, pod.Status.PodIP, n, internet)
	}
}

// requireNetstackFence fails the test unless the template's pods set the netstack fence: without
// it this test would only show that NetworkPolicy alone lapses.
func requireNetstackFence(t *testing.T, c *clusterjobs.Cluster, template string) {
	t.Helper()
	tmpl, err := c.Admin.Extensions.ExtensionsV1beta1().SandboxTemplates(clusterjobs.Namespace).Get(t.Context(), template, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ic := range tmpl.Spec.PodTemplate.Spec.InitContainers {
		if ic.Name == netfenceContainer {
			return
		}
	}
	t.Fatalf("SandboxTemplate %s has no %s init container: apply this branch's deploy/local (make cluster-up)", template, netfenceContainer)
}

// startCanary curls "the internet" every 100 ms from the pod of a pool that NetworkPolicy alone
// fences (the default template without its netstack fence, policyOnlyPool) until the test ends.
// It reaches it only while enforcement is down; it returns the pod's IP.
func startCanary(t *testing.T, c *clusterjobs.Cluster) string {
	t.Helper()
	// No readiness probe: a pod whose fence check fails leaves Ready and its pool replaces it,
	// and the canary must stay one pod, at one address, through every lapse.
	pool := policyOnlyPoolProbed(t, c, "sec-nsfence-canary", 1, false)
	ctx := t.Context()
	warm, err := c.Admin.Extensions.ExtensionsV1beta1().SandboxWarmPools(clusterjobs.Namespace).Get(ctx, pool, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pods, err := c.Admin.Kube.CoreV1().Pods(clusterjobs.Namespace).List(ctx, metav1.ListOptions{LabelSelector: warm.Status.Selector})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("the pod of pool %s: %v (%d pods)", pool, err, len(pods.Items))
	}
	pod := pods.Items[0]
	loop, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		// An exec stream may end (the API server's connection to the kubelet, an idle timeout):
		// the loop starts again, so the canary tries in every round.
		for loop.Err() == nil {
			out, err := c.Exec(loop, pod.Name, "sh", "-c", "while :; do curl -s --connect-timeout 1 --max-time 1 -o /dev/null http://"+internet+"/; sleep 0.1; done")
			if loop.Err() == nil {
				t.Logf("the canary's loop ended (%v: %s); starting it again", err, out)
				time.Sleep(200 * time.Millisecond)
			}
		}
	}()
	t.Cleanup(func() {
		stop()
		<-done
	})
	return pod.Status.PodIP
}
