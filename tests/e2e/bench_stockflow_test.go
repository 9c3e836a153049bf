//go:build e2e

package e2e

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
	"github.com/sandbox-executor/sandbox-executor/tests/runner"
	"github.com/sandbox-executor/sandbox-executor/tools/duoflow"
)

// BenchmarkStockFlowStartup measures the startup a flow's user sees: from the job's hand-out
// (POST /jobs/request) to the flow's first line, the duo CLI's WebSocket session reaching the
// workflow service (its upgrade, timed by the service on this machine). Through gitlab-runner
// 17.9, warm pods, back to back: GitLab's hardened image (stand-in), with no SRT, against the
// default image (stand-in), which probes SRT first; both have the duo CLI baked in (v0.0.11 and
// later) and clone the project first (GIT_DEPTH=1).
func BenchmarkStockFlowStartup(b *testing.B) {
	const n = 3
	cluster := clusterjobs.Connect(b)
	inst, c, base := newFlowRunner(b,
		localcluster.PoolConfig{Name: flowPool, Images: []string{flowImage}, ServeOtherTags: true, EgressProxy: flowEgressAdmin, EgressInstance: true},
		localcluster.PoolConfig{Name: hardenedPool, Images: []string{hardenedImage}, ServeOtherTags: true, EgressProxy: flowEgressAdmin, EgressInstance: true})
	// No npm registry: neither image installs the CLI.
	const noRegistry = "http://registry.invalid/"
	hardened, hardenedPhases := stockStartups(b, cluster, c, inst, n, hardenedPool, func() fakegitlab.Job {
		job := inst.StockJob(base, noRegistry, jobEgressAdmin)
		job.Image.Name = hardenedImage
		return job
	})
	srt, srtPhases := stockStartups(b, cluster, c, inst, n, flowPool, func() fakegitlab.Job { return inst.StockJob(base, noRegistry, jobEgressAdmin) })
	report(b, "flow startup, hardened image (duo CLI baked in, no SRT)", hardened, 0)
	reportPhases(b, hardenedPhases)
	report(b, "flow startup, default image (duo CLI baked in, SRT probed)", srt, hardened.median())
	reportPhases(b, srtPhases)
	b.ReportMetric(float64(hardened.median().Milliseconds()), "hardened-ms/startup")
	b.ReportMetric(float64(srt.median().Milliseconds()), "default-ms/startup")
}

// reportPhases reports where the start-up of a series of jobs went, phase by phase
// (duoflow.StartupPhases), in the order the job goes through them.
func reportPhases(b *testing.B, phases [][]duoflow.Phase) {
	for i := range phases[0] {
		var took samples
		for _, job := range phases {
			took = append(took, job[i].Took)
		}
		report(b, "  of which "+phases[0][i].Name, took, 0) // a nested phase's name is indented
	}
}

// stockStartups runs n stock flow jobs from newJob one after the other, each on a warm pod of
// pool, and returns hand-out -> workflow session for each and each job's start-up split into its
// phases by the job log's timestamps.
func stockStartups(b *testing.B, cluster *clusterjobs.Cluster, c *clusterjobs.Runner, inst *duoflow.Instance, n int, pool string, newJob func() fakegitlab.Job) (samples, [][]duoflow.Phase) {
	var startups samples
	var phases [][]duoflow.Phase
	for i := 0; i < n; i++ {
		waitPoolFull(b, cluster, pool)
		job := newJob()
		job.Variables = append(job.Variables, duoflow.TimestampsVariable)
		inst.GitLab.Enqueue(job)
		proc, err := runner.Start(runner.Options{URL: inst.GitLab.URL(), Token: inst.GitLab.RunnerToken(), Executor: c.Definition(),
			Timeout: 5 * time.Minute, Cache: inst.RunnerCache()})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		res, err := inst.GitLab.Wait(ctx, job.ID)
		cancel()
		proc.Stop()
		if err != nil || res.State != fakegitlab.StateSuccess {
			b.Fatalf("job %d: %v %s\n%s\nrunner log:\n%s", job.ID, err, res.State, res.Trace, proc.Log())
		}
		sessions := inst.Workflows.Sessions(strconv.FormatInt(job.ID, 10))
		if len(sessions) != 1 {
			b.Fatalf("job %d: %d workflow sessions", job.ID, len(sessions))
		}
		startups = append(startups, sessions[0].Started.Sub(res.HandedOutAt))
		split, err := duoflow.StartupPhases(res.Trace, res.HandedOutAt, sessions[0].Started)
		if err != nil {
			b.Fatalf("job %d: %v\n%s", job.ID, err, res.Trace)
		}
		phases = append(phases, split)
		c.WaitJobGone(b, job.ID)
	}
	return startups, phases
}
