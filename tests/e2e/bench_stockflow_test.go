//go:build e2e

package e2e

import (
	"context"
	"regexp"
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
// 17.9, warm pods, back to back: GitLab's default image (stand-in), which installs the duo CLI
// from the npm registry (stand-in) and probes SRT first, against the hardened image (stand-in),
// which has the duo CLI baked in and no SRT. Both clone the project first (GIT_DEPTH=1).
func BenchmarkStockFlowStartup(b *testing.B) {
	const n = 3
	helper, err := duoflow.HelperConfig()
	if err != nil {
		b.Fatal(err)
	}
	inst, err := duoflow.NewInstance()
	if err != nil {
		b.Fatal(err)
	}
	defer inst.Close()
	npm, err := duoflow.NewNPMRegistry()
	if err != nil {
		b.Fatal(err)
	}
	defer npm.Close()
	cluster := clusterjobs.Connect(b)
	c := newRunner(b, cluster, localcluster.Config{Extra: helper, Pools: []localcluster.PoolConfig{
		{Name: flowPool, Images: []string{flowImage}, ServeOtherTags: true, EgressProxy: flowEgressAdmin, EgressInstance: true, EgressAllow: []string{npm.Host + ":80"}},
		{Name: hardenedPool, Images: []string{hardenedImage}, ServeOtherTags: true, EgressProxy: flowEgressAdmin, EgressInstance: true},
	}})
	base, err := inst.CreateProject()
	if err != nil {
		b.Fatal(err)
	}
	setup := `npm config set --location=global registry "$` + duoflow.NPMRegistryVariable + `"`
	baked, _, bakedPhases := stockStartups(b, cluster, c, inst, n, hardenedPool, func() fakegitlab.Job {
		job := inst.StockJob(base, npm.URL, jobEgressAdmin)
		job.Image.Name = hardenedImage
		return job
	})
	viaNPM, npmInstalls, npmPhases := stockStartups(b, cluster, c, inst, n, flowPool, func() fakegitlab.Job { return inst.StockJob(base, npm.URL, jobEgressAdmin, setup) })
	report(b, "flow startup, duo CLI baked in (hardened)", baked, 0)
	reportPhases(b, bakedPhases)
	report(b, "flow startup, duo CLI from npm (default)", viaNPM, baked.median())
	reportPhases(b, npmPhases)
	report(b, "  of which npm install -g (npm's own time)", npmInstalls, 0)
	b.ReportMetric(float64(baked.median().Milliseconds()), "baked-ms/startup")
	b.ReportMetric(float64(viaNPM.median().Milliseconds()), "npm-ms/startup")
}

// npmAdded is npm's closing line: "added 1 package in 317ms" (or "in 1s").
var npmAdded = regexp.MustCompile(`added 1 package in (\d+)(ms|s)`)

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
// pool, and returns hand-out -> workflow session for each, npm's install time where the job log
// has one, and each job's start-up split into its phases by the job log's timestamps.
func stockStartups(b *testing.B, cluster *clusterjobs.Cluster, c *clusterjobs.Runner, inst *duoflow.Instance, n int, pool string, newJob func() fakegitlab.Job) (samples, samples, [][]duoflow.Phase) {
	var startups, installs samples
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
		if m := npmAdded.FindStringSubmatch(res.Trace); m != nil {
			v, _ := strconv.Atoi(m[1])
			unit := time.Millisecond
			if m[2] == "s" {
				unit = time.Second
			}
			installs = append(installs, time.Duration(v)*unit)
		}
		c.WaitJobGone(b, job.ID)
	}
	return startups, installs, phases
}
