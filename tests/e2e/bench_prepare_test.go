//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/utils/ptr"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
)

// benchN is the sample count of a sequential series; BENCH_N overrides it for quick runs.
func benchN(def int) int { return countFromEnv("BENCH_N", def) }

// countFromEnv is the positive count the environment variable name gives, else def.
func countFromEnv(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// benchPool creates a warm pool on the local template with replicas sandboxes, waits until all
// are Ready, and deletes it when the benchmark ends.
func benchPool(b testing.TB, c *clusterjobs.Cluster, name string, replicas int32) {
	b.Helper()
	benchPoolOn(b, c, name, localcluster.Template, replicas)
}

// benchPoolOn is benchPool on another SandboxTemplate.
func benchPoolOn(b testing.TB, c *clusterjobs.Cluster, name, template string, replicas int32) {
	b.Helper()
	ctx := context.Background()
	pools := c.Admin.Extensions.ExtensionsV1beta1().SandboxWarmPools(namespace)
	pool := &extv1beta1.SandboxWarmPool{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"sandbox-executor.gitlab.io/bench": "true"}},
		Spec: extv1beta1.SandboxWarmPoolSpec{
			Replicas:    ptr.To(replicas),
			TemplateRef: extv1beta1.SandboxTemplateRef{Name: template},
		},
	}
	_ = pools.Delete(ctx, name, metav1.DeleteOptions{})
	if _, err := pools.Create(ctx, pool, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = pools.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	waitPoolFull(b, c, name)
}

// waitPoolFull waits until every sandbox the pool asks for is Ready, so the next sample is warm.
func waitPoolFull(b testing.TB, c *clusterjobs.Cluster, name string) {
	b.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		p, err := c.Admin.Extensions.ExtensionsV1beta1().SandboxWarmPools(namespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if p.Status.ReadyReplicas >= ptr.Deref(p.Spec.Replicas, 0) {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("pool %s: %d/%d ready after 3 minutes", name, p.Status.ReadyReplicas, ptr.Deref(p.Spec.Replicas, 0))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// rawClaim is agent-sandbox alone: create a claim on pool and watch it to Ready, as any client
// would. It returns that latency and deletes the claim.
func rawClaim(b *testing.B, c *clusterjobs.Cluster, pool string) time.Duration {
	b.Helper()
	return rawClaimThen(b, c, pool, nil)
}

// rawClaimThen is rawClaim, which also calls then (unless nil) with the claimed sandbox's pod
// once the claim is Ready, outside the latency it returns, and deletes the claim after.
func rawClaimThen(b *testing.B, c *clusterjobs.Cluster, pool string, then func(pod string)) time.Duration {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	claims := c.Admin.Extensions.ExtensionsV1beta1().SandboxClaims(namespace)
	name := fmt.Sprintf("bench-raw-%d", fakegitlab.NextJobID())
	claim := &extv1beta1.SandboxClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: extv1beta1.SandboxClaimSpec{
			WarmPoolRef: extv1beta1.SandboxWarmPoolRef{Name: pool},
			Lifecycle:   &extv1beta1.Lifecycle{ShutdownPolicy: extv1beta1.ShutdownPolicyDelete},
		},
	}
	w, err := claims.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	start := time.Now()
	if _, err := claims.Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	defer claims.Delete(context.Background(), name, metav1.DeleteOptions{})
	for ev := range w.ResultChan() {
		if cl, ok := ev.Object.(*extv1beta1.SandboxClaim); ok && meta.IsStatusConditionTrue(cl.Status.Conditions, "Ready") && cl.Status.SandboxStatus.Name != "" {
			took := time.Since(start)
			if then != nil {
				sbx, err := c.Admin.Sandboxes.AgentsV1beta1().Sandboxes(namespace).Get(ctx, cl.Status.SandboxStatus.Name, metav1.GetOptions{})
				if err != nil {
					b.Fatal(err)
				}
				then(kube.PodNameOf(sbx))
			}
			return took
		}
	}
	b.Fatalf("claim %s: watch ended before Ready: %v", name, ctx.Err())
	return 0
}

// prepareJob runs our prepare as the runner would and returns its duration and the cleanup.
func prepareJob(b *testing.B, r *clusterjobs.Runner) (time.Duration, func()) {
	b.Helper()
	took, _, cleanup := prepareJobLog(b, r)
	return took, cleanup
}

// prepareJobLog is prepareJob, with prepare's output.
func prepareJobLog(b *testing.B, r *clusterjobs.Runner) (time.Duration, string, func()) {
	b.Helper()
	return prepareLogOf(b, newJob(b, r, ciImage))
}

// prepareLogOf runs prepare of job j as the runner would and returns its duration, its output
// and the cleanup.
func prepareLogOf(b *testing.B, j *clusterjobs.Job) (time.Duration, string, func()) {
	b.Helper()
	start := time.Now()
	out, err := j.Command("prepare").CombinedOutput()
	if err != nil {
		b.Fatalf("prepare: %v\n%s", err, out)
	}
	took := time.Since(start)
	return took, string(out), func() {
		if out, err := j.Command("cleanup").CombinedOutput(); err != nil {
			b.Errorf("cleanup: %v\n%s", err, out)
		}
	}
}

// BenchmarkPrepare measures prepare (claim to exec-ready, with the token handed over and the
// agent probed) from a warm pool, sequentially and 10 at once, and from a drained pool, each
// against agent-sandbox's own claim-to-Ready measured in the same run, and a plain gVisor pod
// created until an exec succeeds: what GitLab's Kubernetes executor pays per job before its
// helper and attach.
func BenchmarkPrepare(b *testing.B) {
	c := clusterjobs.Connect(b)
	const warm, cold, wide = "bench-warm", "bench-cold", "bench-wide"
	benchPool(b, c, warm, 2)
	benchPool(b, c, cold, 0)
	warmRunner := newRunner(b, c, localcluster.Config{Pools: localcluster.Pools(warm)})
	// As the chart deploys it: start-runner serves prepare and cleanup (runner.stageServer). Its
	// debug lines break each prepare down (preparedSteps).
	servedRunner := c.NewServedRunner(b, "e2e-served", localcluster.Config{Pools: localcluster.Pools(warm), Extra: "debug = true"})
	coldRunner := newRunner(b, c, localcluster.Config{Pools: localcluster.Pools(cold)})

	var rawWarm, ownWarm, ourWarm samples
	var steps preparedSteps
	for i := 0; i < benchN(30); i++ { // interleaved, each from a full pool
		waitPoolFull(b, c, warm)
		rawWarm = append(rawWarm, rawClaim(b, c, warm))
		waitPoolFull(b, c, warm)
		took, cleanup := prepareJob(b, warmRunner)
		ownWarm = append(ownWarm, took)
		cleanup()
		waitPoolFull(b, c, warm)
		took, log, cleanup := prepareJobLog(b, servedRunner)
		ourWarm = append(ourWarm, took)
		steps.add(b, log)
		cleanup()
	}
	if log := servedRunner.StageServer.Log.String(); strings.Count(log, "prepare exited 0") != len(ourWarm) {
		b.Fatalf("the stage server did not serve every prepare of the served runner:\n%s", log)
	}
	report(b, "warm claim->Ready (agent-sandbox)", rawWarm, 0)
	report(b, "warm prepare, stage server (sandbox-executor)", ourWarm, rawWarm.median())
	report(b, "warm prepare, own process (sandbox-executor)", ownWarm, rawWarm.median())
	steps.report(b)

	const concurrent = 10
	benchPool(b, c, wide, concurrent)
	rawWide := concurrently(concurrent, func() time.Duration { return rawClaim(b, c, wide) })
	waitPoolFull(b, c, wide)
	wideRunner := c.NewServedRunner(b, "e2e-wide", localcluster.Config{Pools: localcluster.Pools(wide)})
	var cleanups []func()
	var mu sync.Mutex
	ourWide := concurrently(concurrent, func() time.Duration {
		took, cleanup := prepareJob(b, wideRunner)
		mu.Lock()
		cleanups = append(cleanups, cleanup)
		mu.Unlock()
		return took
	})
	for _, cleanup := range cleanups {
		cleanup()
	}
	report(b, "10 concurrent warm claims (agent-sandbox)", rawWide, 0)
	report(b, "10 concurrent warm prepares, stage server (sandbox-executor)", ourWide, rawWide.median())

	var rawCold, ourCold, plain samples
	for i := 0; i < benchN(10); i++ {
		rawCold = append(rawCold, rawClaim(b, c, cold))
		took, cleanup := prepareJob(b, coldRunner)
		ourCold = append(ourCold, took)
		cleanup()
		plain = append(plain, plainPodUntilExec(b, c))
	}
	report(b, "plain gVisor pod to exec-ready", plain, 0)
	report(b, "cold claim->Ready (agent-sandbox)", rawCold, plain.median())
	report(b, "cold prepare (sandbox-executor)", ourCold, plain.median())
	report(b, "warm prepare, stage server (sandbox-executor)", ourWarm, plain.median())
	b.ReportMetric(float64(ourWarm.median().Microseconds())/1000, "warm-prepare-ms")
	b.ReportMetric(float64(ourWarm.median())/float64(rawWarm.median()), "warm-prepare/raw-claim")
	b.ReportMetric(float64(ownWarm.median().Microseconds())/1000, "warm-prepare-own-process-ms")
}

// preparedSteps are the served prepares' steps, from their debug lines: the claim's create,
// the sandbox acquired (adopted, its pod verified), the agent (TLS, probe, fence check), and
// how often the stage server's read-aheads served (the identity line, the TLS handshake).
type preparedSteps struct {
	created, acquired, agent samples
	lineAhead, tlsAhead, n   int
}

var (
	claimCreated    = regexp.MustCompile(`SandboxClaim \S+ created in (\d+) ms`)
	sandboxAcquired = regexp.MustCompile(`Sandbox acquired (\d+) ms after prepare started`)
	agentReady      = regexp.MustCompile(`Stage agent ready \(baked in: true, TLS made ahead: (true|false)\) in (\d+) ms`)
)

func (p *preparedSteps) add(b *testing.B, log string) {
	b.Helper()
	created, acquired, agent := claimCreated.FindStringSubmatch(log), sandboxAcquired.FindStringSubmatch(log), agentReady.FindStringSubmatch(log)
	if created == nil || acquired == nil || agent == nil {
		b.Fatalf("prepare's debug lines lack its steps:\n%s", log)
	}
	p.created = append(p.created, msOf(created[1]))
	p.acquired = append(p.acquired, msOf(acquired[1]))
	p.agent = append(p.agent, msOf(agent[2]))
	p.n++
	if strings.Contains(log, "first log line read ahead") {
		p.lineAhead++
	}
	if agent[1] == "true" {
		p.tlsAhead++
	}
}

func (p *preparedSteps) report(b *testing.B) {
	report(b, "  of which claim created", p.created, 0)
	report(b, "  of which sandbox acquired", p.acquired, 0)
	report(b, "  of which agent ready", p.agent, 0)
	line := fmt.Sprintf("  identity line read ahead in %d of %d, TLS made ahead in %d of %d", p.lineAhead, p.n, p.tlsAhead, p.n)
	b.Log(line)
	fmt.Fprintln(os.Stderr, "BENCH", line)
}

func concurrently(n int, f func() time.Duration) samples {
	out := make(samples, n)
	var wg sync.WaitGroup
	for i := range out {
		wg.Add(1)
		go func() { defer wg.Done(); out[i] = f() }()
	}
	wg.Wait()
	return out
}

// plainPodUntilExec creates a bare pod on the gVisor RuntimeClass with the CI image and times
// it until an exec in it succeeds.
func plainPodUntilExec(b *testing.B, c *clusterjobs.Cluster) time.Duration {
	b.Helper()
	_, took, deletePod := startPlainPod(b, c)
	deletePod()
	return took
}

// startPlainPod creates a bare pod on the gVisor RuntimeClass with the CI image, running `sleep
// infinity`, and waits until an exec in it succeeds. It returns the pod as created, that time,
// and the pod's deletion, which is the caller's to run (startPlainPod runs it if it fails).
func startPlainPod(b testing.TB, c *clusterjobs.Cluster) (*corev1.Pod, time.Duration, func()) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pods := c.Admin.Kube.CoreV1().Pods(namespace)
	name := fmt.Sprintf("bench-plain-%d", fakegitlab.NextJobID())
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"sandbox-executor.gitlab.io/bench": "true"}},
		Spec: corev1.PodSpec{
			RuntimeClassName:              ptr.To("gvisor"),
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To(int64(0)),
			Containers: []corev1.Container{{
				Name: "job", Image: ciImage, ImagePullPolicy: corev1.PullNever, Command: []string{"sleep", "infinity"},
			}},
		},
	}
	w, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	start := time.Now()
	created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	deletePod := func() {
		_ = pods.Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	}
	started := false
	defer func() {
		if !started {
			deletePod()
		}
	}()
	for ev := range w.ResultChan() {
		if p, ok := ev.Object.(*corev1.Pod); ok && p.Status.Phase == corev1.PodRunning {
			break
		}
	}
	for {
		err := c.Admin.Exec.Exec(ctx, kube.ExecRequest{Namespace: namespace, Pod: name, Container: "job", Command: []string{"true"}, Stdout: io.Discard, Stderr: io.Discard})
		if err == nil {
			started = true
			return created, time.Since(start), deletePod
		}
		if ctx.Err() != nil {
			b.Fatalf("pod %s: no successful exec: %v", name, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// BenchmarkWholeJob is the executor's whole overhead for a 5-stage job: config, prepare, five
// empty stages and cleanup, each a process as the runner starts them, against a plain gVisor pod
// created until exec-ready (no stage run at all) measured in the same run; and the same job with
// prepare, run and cleanup through the stage launcher and the stage server (the chart's default).
func BenchmarkWholeJob(b *testing.B) {
	c := newCluster(b)
	s := c.NewServedRunner(b, "e2e-whole-served", localcluster.Config{})
	s.GoneTimeout = time.Minute
	var whole, served, plain samples
	oneJob := func(r *clusterjobs.Runner) time.Duration {
		waitPoolFull(b, r.Cluster, localcluster.Pool)
		j := newJob(b, r, ciImage)
		empty := j.Script(b, ":\n")
		start := time.Now()
		for _, args := range [][]string{{"config"}, {"prepare"}, {"run", empty, "prepare_script"}, {"run", empty, "get_sources"},
			{"run", empty, "build_script"}, {"run", empty, "after_script"}, {"run", empty, "cleanup_file_variables"}, {"cleanup"}} {
			if out, err := j.Command(args...).CombinedOutput(); err != nil {
				b.Fatalf("%s: %v\n%s", args[0], err, out)
			}
		}
		return time.Since(start)
	}
	for i := 0; i < benchN(10); i++ {
		whole = append(whole, oneJob(c))
		served = append(served, oneJob(s))
		plain = append(plain, plainPodUntilExec(b, c.Cluster))
	}
	report(b, "plain gVisor pod to exec-ready", plain, 0)
	report(b, "whole job, 5 empty stages", whole, plain.median())
	report(b, "whole job, served (launcher)", served, plain.median())
	b.ReportMetric(float64(whole.median())/float64(plain.median()), "job/plain-pod")
	b.ReportMetric(float64(served.median())/float64(plain.median()), "served-job/plain-pod")
}

// BenchmarkLogThroughput streams 200 MB of job log out of one stage through `sandbox-executor
// run` and through a raw exec of the same command on the same pod.
func BenchmarkLogThroughput(b *testing.B) {
	c := newCluster(b)
	j, pod, _ := preparedJob(b, c, ciImage)
	clients := c.Clients(b)
	const size = 200 << 20
	command := fmt.Sprintf("yes 'a line of job log output, as a build tool would print it' | head -c %d\n", size)
	scriptPath := j.Script(b, command)
	var raw, ours []float64
	for i := 0; i < benchN(3); i++ {
		var n countingWriter
		start := time.Now()
		if err := clients.Exec.Exec(context.Background(), kube.ExecRequest{Namespace: namespace, Pod: pod, Container: "job",
			Command: []string{"/bin/bash", "-c", command}, Stdout: &n, Stderr: io.Discard}); err != nil || n != size {
			b.Fatalf("raw exec: %v, %d bytes", err, n)
		}
		raw = append(raw, float64(n)/1e6/time.Since(start).Seconds())
		n = 0
		run := j.Command("run", scriptPath, "build_script")
		run.Stdout, run.Stderr = &n, io.Discard
		start = time.Now()
		if err := run.Run(); err != nil || n != size {
			b.Fatalf("run: %v, %d bytes", err, n)
		}
		ours = append(ours, float64(n)/1e6/time.Since(start).Seconds())
	}
	reportRate(b, "200 MB log, raw exec", raw, 0)
	reportRate(b, "200 MB log, sandbox-executor run", ours, medianOf(raw))
	b.ReportMetric(medianOf(ours)/medianOf(raw), "run/raw-throughput")
}

type countingWriter int64

func (w *countingWriter) Write(p []byte) (int, error) {
	*w += countingWriter(len(p))
	return len(p), nil
}

func medianOf(v []float64) float64 {
	c := append([]float64(nil), v...)
	for i := range c { // insertion sort: a handful of values
		for j := i; j > 0 && c[j] < c[j-1]; j-- {
			c[j], c[j-1] = c[j-1], c[j]
		}
	}
	return c[len(c)/2]
}

func reportRate(b testing.TB, name string, mbps []float64, baseline float64) {
	reportValues(b, name, mbps, "MB/s", "", baseline)
}

// reportValues is report for values in unit, with a note after the order statistics.
func reportValues(b testing.TB, name string, values []float64, unit, note string, baseline float64) {
	lo, hi := values[0], values[0]
	for _, v := range values {
		lo, hi = min(lo, v), max(hi, v)
	}
	line := fmt.Sprintf("%-28s n=%d median=%.1f%s min=%.1f%s max=%.1f%s%s", name, len(values), medianOf(values), unit, lo, unit, hi, unit, note)
	if baseline > 0 {
		line += fmt.Sprintf(" ratio=%.2fx", medianOf(values)/baseline)
	}
	b.Log(line)
	fmt.Fprintln(os.Stderr, "BENCH", line)
}

// BenchmarkWarmClaimReady is agent-sandbox's controller alone, wherever it runs (in-cluster on
// the local cluster): BENCH_N (20) sequential claims on a full warm pool of 2, each created and
// watched to Ready. A quick figure for comparing controller deployments; BenchmarkPrepare has
// the same series interleaved with ours.
func BenchmarkWarmClaimReady(b *testing.B) {
	c := clusterjobs.Connect(b)
	const pool = "bench-claim"
	benchPool(b, c, pool, 2)
	var raw samples
	for i := 0; i < benchN(20); i++ {
		waitPoolFull(b, c, pool)
		raw = append(raw, rawClaim(b, c, pool))
	}
	report(b, "warm claim->Ready (agent-sandbox)", raw, 0)
	b.ReportMetric(float64(raw.median().Microseconds())/1000, "claim-ready-ms")
}
