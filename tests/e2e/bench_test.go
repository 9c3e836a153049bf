//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/clock"

	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/gitlab"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
	"github.com/sandbox-executor/sandbox-executor/tests/runner"
	"github.com/sandbox-executor/sandbox-executor/tests/runner/localexecutor"
)

// samples collects durations and reports order statistics.
type samples []time.Duration

func (s samples) sorted() samples {
	c := append(samples(nil), s...)
	sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
	return c
}

func (s samples) median() time.Duration { c := s.sorted(); return c[len(c)/2] }
func (s samples) p95() time.Duration    { c := s.sorted(); return c[(len(c)*95+99)/100-1] }

func (s samples) String() string {
	c := s.sorted()
	return fmt.Sprintf("n=%d median=%s p95=%s min=%s max=%s", len(c), ms(s.median()), ms(s.p95()), ms(c[0]), ms(c[len(c)-1]))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }

// BenchmarkStageOverhead compares, on one pod, a plain exec of a script (bash reading it from
// stdin, as `kubectl exec -i` would) with the same script run as a detached stage through the
// in-pod agent over exec (the default path) and over the pod network (stage_transport =
// "network"), and with the whole `sandbox-executor run` process on the network path, and the
// same run through the stage launcher and the stage server (run_exec naming
// sandbox-executor-stage, the chart's default).
func BenchmarkStageOverhead(b *testing.B) {
	c := newClusterOn(b, runPath{"served", true}, `stage_transport = "network"`)
	j, pod, _ := preparedJob(b, c, ciImage)
	clients := c.Clients(b)
	network, state := j.AgentExecutor(b, clients.Exec)
	if !state.Transport.Network() {
		b.Fatalf("prepare chose %s, not the pod network", state.Transport)
	}
	sbx := *state.Sandbox
	stageOver := func(ex kube.RemoteExecutor) *executor.StageRunner {
		return &executor.StageRunner{Exec: ex, Sandbox: &sbx, Log: gitlab.NewJobLog(nil, false, clock.RealClock{}),
			PodGone: func(context.Context) (string, error) { return "", nil }, Reconnects: 3, Backoff: kube.RetryBackoff(), KillGrace: time.Second}
	}
	viaExec, viaNetwork := stageOver(clients.Exec), stageOver(network)
	script := []byte("echo stage\n")
	scriptPath := j.Script(b, string(script))
	const n = 21
	var raw, detachedExec, detachedNet, cli, served samples
	timeStage := func(into *samples, r *executor.StageRunner) {
		var out, errOut bytes.Buffer
		t0 := time.Now()
		if code, err := r.Run(context.Background(), "bench", script, &out, &errOut); err != nil || code != 0 || out.String() != "stage\n" {
			b.Fatalf("detached stage: %d %v %q", code, err, out.String())
		}
		*into = append(*into, time.Since(t0))
	}
	for i := 0; i < n; i++ { // interleaved, so drift on a shared machine hits every path alike
		took, _ := rawExec(b, clients.Exec, pod, script)
		raw = append(raw, took)
		timeStage(&detachedExec, viaExec)
		timeStage(&detachedNet, viaNetwork)
		c.RunDirect = true // sandbox-executor run, in its own process
		t0 := time.Now()
		if out, err := j.Command("run", scriptPath, "build_script").CombinedOutput(); err != nil {
			b.Fatalf("run: %v %s", err, out)
		}
		cli = append(cli, time.Since(t0))
		c.RunDirect = false // sandbox-executor-stage run, through the stage server
		t0 = time.Now()
		if out, err := j.Command("run", scriptPath, "build_script").CombinedOutput(); err != nil {
			b.Fatalf("served run: %v %s", err, out)
		}
		served = append(served, time.Since(t0))
	}
	report(b, "raw exec (bash -s)", raw, 0)
	report(b, "detached stage, exec", detachedExec, raw.median())
	report(b, "detached stage, network", detachedNet, raw.median())
	report(b, "sandbox-executor run, network", cli, raw.median())
	report(b, "launcher + server run, network", served, raw.median())
	b.ReportMetric(float64(detachedExec.median())/float64(raw.median()), "exec/raw")
	b.ReportMetric(float64(detachedNet.median())/float64(raw.median()), "network/raw")
	b.ReportMetric(float64(detachedNet.median().Microseconds())/1000, "network-ms/stage")
	b.ReportMetric(float64(served.median())/float64(cli.median()), "served/direct-run")
}

// rawExec runs script in pod's job container as `kubectl exec -i` would (bash reading it from
// stdin) and returns how long that took and its output (stdout, then stderr); a script that
// fails fails the benchmark.
func rawExec(b *testing.B, ex kube.RemoteExecutor, pod string, script []byte) (time.Duration, string) {
	b.Helper()
	var out, errOut bytes.Buffer
	t0 := time.Now()
	if err := ex.Exec(context.Background(), kube.ExecRequest{Namespace: namespace, Pod: pod, Container: "job",
		Command: []string{"/bin/bash", "-s"}, Stdin: bytes.NewReader(script), Stdout: &out, Stderr: &errOut}); err != nil {
		b.Fatalf("raw exec in %s: %v\n%s%s", pod, err, out.String(), errOut.String())
	}
	return time.Since(t0), out.String() + errOut.String()
}

func report(b testing.TB, name string, s samples, baseline time.Duration) {
	line := fmt.Sprintf("%-28s %s", name, s)
	if baseline > 0 {
		line += fmt.Sprintf(" ratio=%.2fx", float64(s.median())/float64(baseline))
	}
	b.Log(line)
	fmt.Fprintln(os.Stderr, "BENCH", line)
}

// BenchmarkHelloJob is the headline: `script: [echo hello]` through the real gitlab-runner
// (17.9.0 unless SANDBOX_EXECUTOR_GITLAB_RUNNER says otherwise; it runs 4 stages for this job)
// and the fake GitLab, from the job being handed out to its final state. The same runner with a
// host-local executor (no isolation at all) is the floor, measured in the same run. Then what
// sizes a pool: the same job from a pool at rest (no refill running when it starts), a burst of
// 10 jobs at once (10 runner processes), and how fast the node boots the sandboxes that refill
// the pool behind them (docs/performance.md#sizing-a-warm-pool).
func BenchmarkHelloJob(b *testing.B) {
	n := benchN(20)
	const burst, spaced, overExecN = 10, 7, 7
	// A pool as large as the round: every job of it starts warm, as a pool sized for the
	// runner's concurrency serves production jobs; refills still run during the round.
	cluster := clusterjobs.Connect(b)
	const hello = "bench-hello"
	benchPool(b, cluster, hello, int32(max(n, burst)))
	// As the chart deploys it: prepare, run and cleanup through the stage server; and with run
	// in its own process (run_exec naming sandbox-executor, runner.serveRun false).
	network := cluster.NewServedRunner(b, "e2e-hello", localcluster.Config{Pools: localcluster.Pools(hello), Extra: `stage_transport = "network"`})
	runDirect := network.Definition()
	runDirect.RunExec = network.Binary()
	exec := newRunner(b, cluster, localcluster.Config{Pools: localcluster.Pools(hello), Extra: `stage_transport = "exec"`})
	local := localexecutor.New(b)
	floor, _ := helloJobs(b, n, local.Definition, local.Env)
	waitPoolFull(b, cluster, hello)
	overNetwork, traces := helloJobs(b, n, network.Definition(), nil)
	waitPoolFull(b, cluster, hello)
	runInItsProcess, _ := helloJobs(b, n, runDirect, nil)
	var atRest samples
	for i := 0; i < spaced; i++ {
		waitPoolFull(b, cluster, hello)
		one, _ := helloJobs(b, 1, network.Definition(), nil)
		atRest = append(atRest, one...)
	}
	waitPoolFull(b, cluster, hello)
	overExec, _ := helloJobs(b, overExecN, exec.Definition(), nil)
	inBurst, makespan, refilled := burstAndRefill(b, cluster, hello, burst, network.Definition())

	report(b, "hello job, runner alone", floor, 0)
	report(b, "hello job, stages over network (stage server)", overNetwork, floor.median())
	report(b, "hello job, same, run in its own process", runInItsProcess, floor.median())
	report(b, "hello job, pool at rest", atRest, floor.median())
	report(b, "hello job, stages over exec", overExec, floor.median())
	report(b, fmt.Sprintf("hello job, burst of %d", burst), inBurst, floor.median())
	reportRefill(fmt.Sprintf("burst of %d", burst), burst, makespan, refilled)
	// Where the network job's time goes, from the summary line that closes each job log.
	var claim, prepare, stages, scripts, runnerOwn samples
	for i, trace := range traces {
		m := summaryOf(b, trace)
		claim = append(claim, msOf(m[1]))
		prepare = append(prepare, msOf(m[2]))
		stages = append(stages, msOf(m[4]))
		scripts = append(scripts, msOf(m[5]))
		runnerOwn = append(runnerOwn, overNetwork[i]-msOf(m[2])-msOf(m[4])-msOf(m[5]))
		b.Logf("summary: %s", m[0])
	}
	report(b, "  of which claim (in prepare)", claim, 0)
	report(b, "  of which prepare", prepare, 0)
	report(b, "  of which 4 stages' own cost", stages, 0)
	report(b, "  of which scripts", scripts, 0)
	report(b, "  of which runner and the rest", runnerOwn, 0)
	b.ReportMetric(float64(overExec.median().Milliseconds()), "exec-ms/job")
	b.ReportMetric(float64(overNetwork.median().Milliseconds()), "network-ms/job")
	b.ReportMetric(float64(floor.median().Milliseconds()), "floor-ms/job")
}

// summaryLine is the executor's closing job log line: claim, prepare, stage count, stages' cost,
// scripts.
var summaryLine = regexp.MustCompile(`(?:claimed|created) in (\d+) ms; executor overhead \d+ ms \(prepare (\d+) ms, (\d+) stages (\d+) ms\); scripts (\d+) ms`)

// summaryOf is the submatches of summaryLine in a job log; a log without one fails the benchmark.
func summaryOf(b *testing.B, trace string) []string {
	b.Helper()
	m := summaryLine.FindStringSubmatch(trace)
	if m == nil {
		b.Fatalf("job log has no summary line:\n%s", trace)
	}
	return m
}

func msOf(digits string) time.Duration {
	n, _ := strconv.Atoi(digits)
	return time.Duration(n) * time.Millisecond
}

// helloJobs runs n hello jobs back to back through one real runner and returns their durations
// and job logs.
func helloJobs(b *testing.B, n int, def runner.CustomExecutor, env []string) (samples, []string) {
	s, traces, _ := helloRound(b, n, 1, def, env)
	return s, traces
}

// helloBurst hands out k hello jobs at once to k runner processes (one job each) and returns the
// jobs' durations and the time until the last one finished.
func helloBurst(b *testing.B, k int, def runner.CustomExecutor) (samples, time.Duration) {
	s, _, took := helloRound(b, k, k, def, nil)
	return s, took
}

// burstAndRefill hands out burst hello jobs at once from the full pool and waits until the pool
// is full again: the jobs' durations, the time until the last finished, and the time from the
// burst's start until the pool was full again.
func burstAndRefill(b *testing.B, c *clusterjobs.Cluster, pool string, burst int, def runner.CustomExecutor) (samples, time.Duration, time.Duration) {
	waitPoolFull(b, c, pool)
	start := time.Now()
	inBurst, makespan := helloBurst(b, burst, def)
	waitPoolFull(b, c, pool)
	return inBurst, makespan, time.Since(start)
}

// reportRefill prints what burstAndRefill measured under label: the burst's makespan and the
// node's refill rate behind it.
func reportRefill(label string, burst int, makespan, refilled time.Duration) {
	fmt.Fprintf(os.Stderr, "BENCH   %s: all done in %s; the pool was full again %s after the burst began: %.2f sandboxes booted per second\n",
		label, ms(makespan), ms(refilled), float64(burst)/refilled.Seconds())
}

// helloRound enqueues n hello jobs, starts runners runner processes that share them (n/runners
// jobs each), and returns the jobs' durations and logs, and the time until the last finished.
func helloRound(b *testing.B, n, runners int, def runner.CustomExecutor, env []string) (samples, []string, time.Duration) {
	gitlab := fakegitlab.New(fakegitlab.WithLongPolling(5 * time.Second))
	defer gitlab.Close()
	var ids []int64
	for i := 0; i < n; i++ {
		ids = append(ids, gitlab.Enqueue(gitlab.NewJob(fakegitlab.JobSpec{Image: ciImage, GitStrategy: "none", Script: []string{"echo hello"}})))
	}
	start := time.Now()
	var procs []*runner.Process
	for i := 0; i < runners; i++ {
		proc, err := runner.Start(runner.Options{URL: gitlab.URL(), Token: gitlab.RunnerToken(), Executor: def, Env: env, MaxBuilds: n / runners, Timeout: 10 * time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		defer proc.Stop()
		procs = append(procs, proc)
	}
	var s samples
	var traces []string
	for _, id := range ids {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		res, err := gitlab.Wait(ctx, id)
		cancel()
		if err != nil || res.State != "success" {
			var logs strings.Builder
			for _, proc := range procs {
				logs.WriteString(proc.Log())
			}
			b.Fatalf("job %d: %v %s\n%s\nrunner logs:\n%s", id, err, res.State, res.Trace, logs.String())
		}
		s = append(s, res.Duration())
		traces = append(traces, res.Trace)
	}
	return s, traces, time.Since(start)
}
