//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/tests/harness/agentcontroller"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
	"github.com/sandbox-executor/sandbox-executor/tests/runner"
)

// replenishDelay holds a pool's refill until 3 s after its last member left: back-to-back claims
// then run on cores no sandbox boot takes (docs/performance.md#jobs-before-refills-the-controllers-replenish-delay).
// The local cluster's controller runs with it (tests/cluster/agent-sandbox.sh), as docs/install.md
// recommends; noReplenishDelay is agent-sandbox's default, for the comparison.
const replenishDelay, noReplenishDelay = "--sandbox-warm-pool-replenish-delay=3s", "--sandbox-warm-pool-replenish-delay=0s"

// BenchmarkJobsBeforeRefills measures what the agent-sandbox controller's replenish delay does
// to jobs: BENCH_N (12) hello jobs back to back through the stage server from a pool as large,
// the same job from a pool at rest, and a burst of 10 with the refill behind it, first with the
// controller as the local cluster runs it (replenishDelay), then with the controller rolled out
// without a delay (agent-sandbox's default). Each setting's back-to-back jobs are compared with
// its own at-rest jobs, and the delay's with no delay's. The controller's args are rolled back
// out when the benchmark ends, after a failure too, and a claim on the pool proves the cluster
// whole.
func BenchmarkJobsBeforeRefills(b *testing.B) {
	n := benchN(12)
	const burst, atRestN = 10, 5
	cluster := clusterjobs.Connect(b)
	const pool = "bench-refill"
	benchPool(b, cluster, pool, int32(max(n, burst)))
	served := cluster.NewServedRunner(b, "e2e-refill", localcluster.Config{Pools: localcluster.Pools(pool), Extra: `stage_transport = "network"`})
	measure := func() refillRound { return measureRefills(b, cluster, pool, served.Definition(), n, atRestN, burst) }

	delayed := measure()
	// To stderr, not b.Logf: a benchmark's log is cut to its first lines, and whether the
	// controller came back must show.
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "agentcontroller: "+format+"\n", args...) }
	restore, err := agentcontroller.WithArgs(context.Background(), cluster.Admin.Kube, logf, noReplenishDelay)
	if err != nil {
		b.Fatal(err)
	}
	// Registered after benchPool's cleanup, so it runs first: the pool is still there to claim from.
	b.Cleanup(func() {
		if err := restore(context.Background()); err != nil {
			b.Errorf("the agent-sandbox controller's args are not restored: %v", err)
			return
		}
		waitPoolFull(b, cluster, pool)
		logf("a claim on pool %s was Ready in %s after the args were restored", pool, ms(rawClaim(b, cluster, pool)))
	})
	none := measure()

	report(b, "hello job, back to back (no replenish delay)", none.backToBack, 0)
	report(b, "hello job, at rest (no replenish delay)", none.atRest, 0)
	report(b, "hello job, back to back (replenish delay 3s)", delayed.backToBack, none.backToBack.median())
	report(b, "hello job, at rest (replenish delay 3s)", delayed.atRest, none.atRest.median())
	noneRatio, delayedRatio := none.backToBackOverAtRest(), delayed.backToBackOverAtRest()
	fmt.Fprintf(os.Stderr, "BENCH   back to back / at rest: %.2fx without a replenish delay, %.2fx with %s (the local cluster's)\n", noneRatio, delayedRatio, replenishDelay)
	report(b, "  of which claim, back to back (no replenish delay)", none.claim, 0)
	report(b, "  of which claim, back to back (replenish delay 3s)", delayed.claim, none.claim.median())
	report(b, fmt.Sprintf("hello job, burst of %d (no replenish delay)", burst), none.inBurst, 0)
	report(b, fmt.Sprintf("hello job, burst of %d (replenish delay 3s)", burst), delayed.inBurst, none.inBurst.median())
	reportRefill(fmt.Sprintf("burst of %d (no replenish delay)", burst), burst, none.makespan, none.refilled)
	reportRefill(fmt.Sprintf("burst of %d (replenish delay 3s)", burst), burst, delayed.makespan, delayed.refilled)
	b.ReportMetric(noneRatio, "back-to-back/at-rest-no-delay")
	b.ReportMetric(delayedRatio, "back-to-back/at-rest-delay")
}

// refillRound is one controller setting's figures.
type refillRound struct {
	backToBack, atRest, inBurst samples
	// claim is each back-to-back job's claim inside prepare, from its summary line.
	claim samples
	// makespan is the burst's first hand-out to its last job's end; refilled, to the pool full
	// again.
	makespan, refilled time.Duration
}

// measureRefills runs n hello jobs back to back from the full pool, then atRestN jobs each from
// the full pool, then a burst of burst jobs at once and waits for the pool to refill.
func measureRefills(b *testing.B, c *clusterjobs.Cluster, pool string, def runner.CustomExecutor, n, atRestN, burst int) refillRound {
	var r refillRound
	waitPoolFull(b, c, pool)
	backToBack, traces := helloJobs(b, n, def, nil)
	r.backToBack = backToBack
	for _, trace := range traces {
		m := summaryLine.FindStringSubmatch(trace)
		if m == nil {
			b.Fatalf("job log has no summary line:\n%s", trace)
		}
		r.claim = append(r.claim, msOf(m[1]))
	}
	for range atRestN {
		waitPoolFull(b, c, pool)
		one, _ := helloJobs(b, 1, def, nil)
		r.atRest = append(r.atRest, one...)
	}
	r.inBurst, r.makespan, r.refilled = burstAndRefill(b, c, pool, burst, def)
	return r
}

func (r refillRound) backToBackOverAtRest() float64 {
	return float64(r.backToBack.median()) / float64(r.atRest.median())
}
