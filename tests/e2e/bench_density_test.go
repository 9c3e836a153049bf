//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/podmemory"
)

// agentSandboxGVisorPodMiB is agent-sandbox's published unique RAM per gVisor pod: Chrome
// sandboxes on a GKE c4-standard-8 node (examples/gke-swap/runtimes/README.md, "Host Memory
// Footprint per Pod"). A constant from elsewhere, not a baseline of the run.
const agentSandboxGVisorPodMiB = 206.0

// BenchmarkDensity is the host memory a pod holds on this node, the local cluster's only one:
// a plain gVisor pod running `sleep infinity` (the baseline: same RuntimeClass and image), an
// idle warm pod of the local pool template, and a pod running a job's stage. Per pod, the PSS
// summed over its host processes (runsc's sandbox with its stubs and a gofer per container, in
// the pod's cgroup; a containerd shim per container and the shims' `runsc wait`, outside it):
// what the host spends on it, the headline; beside it the pod cgroup's working set, the
// kubelet's figure (tests/harness/podmemory). Then the agent's own resident memory inside the
// sandbox, which the sandbox's PSS includes, and how many pods a GiB of node memory holds.
func BenchmarkDensity(b *testing.B) {
	const plainPods, warmPods, runningJobs = 4, 6, 3
	// Long enough that every pod's stage is still running when all are measured; the
	// replacements the pool boots meanwhile slow the stages' start.
	const stageSeconds = 30
	c := clusterjobs.Connect(b)
	node, err := podmemory.Local()
	if err != nil {
		b.Fatal(err)
	}
	var plain []*corev1.Pod
	for range plainPods {
		pod, _, deletePod := startPlainPod(b, c)
		b.Cleanup(deletePod)
		plain = append(plain, pod)
	}
	const pool = "bench-density"
	benchPool(b, c, pool, warmPods)
	warm := poolPods(b, c, pool)
	// Ready is the end of a pod's boot: let the sentries and agents settle, as pods waiting in
	// a pool do.
	time.Sleep(10 * time.Second)
	plainUse := measurePods(b, node, plain)
	warmUse := measurePods(b, node, warm)
	plainMiB, warmMiB := medianOf(pssMiB(plainUse)), medianOf(pssMiB(warmUse))
	reportMemory(b, "plain gVisor pod (sleep infinity)", plainUse, 0)
	reportMemory(b, "idle warm pod ("+localcluster.Template+")", warmUse, plainMiB)

	r := newRunner(b, c, localcluster.Config{Pools: localcluster.Pools(pool)})
	var jobs []*clusterjobs.Job
	for range runningJobs {
		j := newJob(b, r, ciImage)
		j.Prepare(b)
		jobs = append(jobs, j)
	}
	var stages []*runningStage
	for _, j := range jobs {
		stages = append(stages, startStage(b, j, stageSeconds))
	}
	var jobPods []*corev1.Pod
	for i, s := range stages {
		s.waitRunning(b)
		jobPods = append(jobPods, jobs[i].PodObject(b))
	}
	runningUse := measurePods(b, node, jobPods)
	for _, s := range stages {
		s.stillRunning(b) // measured while every stage ran
	}
	runningMiB := medianOf(pssMiB(runningUse))
	reportMemory(b, fmt.Sprintf("pod running a job (sleep %d)", stageSeconds), runningUse, plainMiB)
	var agentServing []float64
	for _, pod := range jobPods {
		if m, ok := agentRSSMiB(b, c, pod.Name); ok {
			agentServing = append(agentServing, m)
		}
	}
	for _, s := range stages {
		s.wait(b)
	}
	// The warm pods no job claimed: their agents idle, measured after their sandboxes were.
	var agentIdle []float64
	for _, pod := range warm {
		if claimedBy(pod, jobPods) {
			continue
		}
		if m, ok := agentRSSMiB(b, c, pod.Name); ok {
			agentIdle = append(agentIdle, m)
		}
	}

	// The agent's memory is the sandbox's: in it, not beside it.
	if len(agentIdle) > 0 && len(agentServing) > 0 {
		reportValues(b, "  of which the agent, idle (RSS in gVisor)", agentIdle, "MiB", "", 0)
		reportValues(b, "  of which the agent and its stage daemon, serving the stage", agentServing, "MiB", "", 0)
	}
	line := fmt.Sprintf("  per GiB of node memory: %.1f idle warm pods, %.1f running jobs, %.1f plain gVisor pods; agent-sandbox publishes %.0f MiB unique RAM per gVisor pod (Chrome sandboxes on GKE: %.1f per GiB), %.2fx an idle warm pod here",
		1024/warmMiB, 1024/runningMiB, 1024/plainMiB, agentSandboxGVisorPodMiB, 1024/agentSandboxGVisorPodMiB, agentSandboxGVisorPodMiB/warmMiB)
	b.Log(line)
	fmt.Fprintln(os.Stderr, "BENCH", line)
	b.ReportMetric(warmMiB, "warm-pod-MiB")
	b.ReportMetric(runningMiB, "job-pod-MiB")
	b.ReportMetric(1024/warmMiB, "warm-pods/GiB")
}

// poolPods are the pods of the pool's sandboxes, by the pool's selector.
func poolPods(b *testing.B, c *clusterjobs.Cluster, pool string) []*corev1.Pod {
	b.Helper()
	ctx := context.Background()
	p, err := c.Admin.Extensions.ExtensionsV1beta1().SandboxWarmPools(namespace).Get(ctx, pool, metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	list, err := c.Admin.Kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: p.Status.Selector})
	if err != nil {
		b.Fatal(err)
	}
	var pods []*corev1.Pod
	for i := range list.Items {
		pods = append(pods, &list.Items[i])
	}
	if len(pods) != int(ptr.Deref(p.Spec.Replicas, 0)) {
		b.Fatalf("pool %s: %d pods by its selector %q, want %d", pool, len(pods), p.Status.Selector, ptr.Deref(p.Spec.Replicas, 0))
	}
	return pods
}

// measurePods measures each pod on this node, and logs what it found.
func measurePods(b *testing.B, node podmemory.Node, pods []*corev1.Pod) []podmemory.Usage {
	b.Helper()
	var use []podmemory.Usage
	for _, pod := range pods {
		u, err := node.Pod(string(pod.UID))
		if err != nil {
			b.Fatalf("pod %s: %v", pod.Name, err)
		}
		b.Logf("pod %s: PSS %.1fMiB (%s); cgroup %s working set %.1fMiB", pod.Name, mib(u.PSS), byName(u.Processes), u.Cgroup, mib(u.WorkingSet))
		use = append(use, u)
	}
	return use
}

// byName sums the processes' PSS by name: "runsc-sandbox×4 24.1MiB, ...".
func byName(procs []podmemory.Process) string {
	count, pss := map[string]int{}, map[string]uint64{}
	var names []string
	for _, p := range procs {
		if count[p.Name] == 0 {
			names = append(names, p.Name)
		}
		count[p.Name]++
		pss[p.Name] += p.PSS
	}
	var parts []string
	for _, name := range names {
		parts = append(parts, fmt.Sprintf("%s×%d %.1fMiB", name, count[name], mib(pss[name])))
	}
	return strings.Join(parts, ", ")
}

func reportMemory(b *testing.B, name string, use []podmemory.Usage, baselineMiB float64) {
	var outside, workingSet []float64
	for _, u := range use {
		outside = append(outside, mib(u.OutsideCgroupPSS()))
		workingSet = append(workingSet, mib(u.WorkingSet))
	}
	note := fmt.Sprintf(" PSS (%.1fMiB of it outside the pod cgroup: shims, runsc wait); pod cgroup working set median=%.1fMiB", medianOf(outside), medianOf(workingSet))
	reportValues(b, name, pssMiB(use), "MiB", note, baselineMiB)
}

func pssMiB(use []podmemory.Usage) []float64 {
	var v []float64
	for _, u := range use {
		v = append(v, mib(u.PSS))
	}
	return v
}

func mib(bytes uint64) float64 { return float64(bytes) / (1 << 20) }

func claimedBy(pod *corev1.Pod, jobPods []*corev1.Pod) bool {
	return slices.ContainsFunc(jobPods, func(p *corev1.Pod) bool { return p.UID == pod.UID })
}

// agentRSSMiB is the resident memory of the agent's processes in the pod (the agent, PID 1 of
// the job container, and the stage daemon it starts at prepare) as gVisor's kernel counts it, from
// /proc/<pid>/status in the sandbox: summed, so their shared text counts once per process. It
// logs every process of the container with its RSS, and is false if it found no agent.
func agentRSSMiB(b *testing.B, c *clusterjobs.Cluster, pod string) (float64, bool) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := c.Exec(ctx, pod, "/bin/sh", "-c", `grep -E '^(Name|VmRSS):' /proc/[0-9]*/status`)
	if err != nil {
		b.Logf("pod %s: the agent's memory not read: %v %s", pod, err, out)
		return 0, false
	}
	name, rss := map[string]string{}, map[string]float64{}
	for _, line := range strings.Split(out, "\n") {
		// /proc/<pid>/status:<key>:\t<value>
		file, rest, _ := strings.Cut(line, ":")
		key, value, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		pid := strings.TrimSuffix(strings.TrimPrefix(file, "/proc/"), "/status")
		switch value = strings.TrimSpace(value); key {
		case "Name":
			name[pid] = value
		case "VmRSS":
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(value, " kB"), 64)
			rss[pid] = kb / 1024
		}
	}
	var sum float64
	var procs []string
	for pid, n := range name {
		procs = append(procs, fmt.Sprintf("%s[%s] %.1fMiB", n, pid, rss[pid]))
		if n == "agent" {
			sum += rss[pid]
		}
	}
	slices.Sort(procs)
	b.Logf("pod %s, in the sandbox: %s", pod, strings.Join(procs, ", "))
	if name["1"] != "agent" {
		b.Logf("pod %s: PID 1 of the job container is %q, not the agent", pod, name["1"])
		return 0, false
	}
	return sum, true
}

// runningStage is a job's build_script stage run in the background: it prints a line its
// script computes, then sleeps.
type runningStage struct {
	job     *clusterjobs.Job
	running chan struct{} // closed when the stage printed its line
	done    chan error
	// What it wrote, to read once it ended.
	output strings.Builder
	stderr bytes.Buffer
}

// stageRunning is what the stage's script prints: computed, so that an echo of the script
// itself cannot pass for it.
const stageRunning = "stage 42 running"

func startStage(b *testing.B, j *clusterjobs.Job, seconds int) *runningStage {
	b.Helper()
	s := &runningStage{job: j, running: make(chan struct{}), done: make(chan error, 1)}
	cmd := j.Command("run", j.Script(b, fmt.Sprintf("echo stage $((6*7)) running\nsleep %d\n", seconds)), "build_script")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = &s.stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	// Before the job's cleanup, which Prepare registered earlier: cleanups run last first.
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-s.done
	})
	go func() {
		lines := bufio.NewScanner(stdout)
		seen := false
		for lines.Scan() {
			s.output.WriteString(lines.Text() + "\n")
			if !seen && lines.Text() == stageRunning {
				seen = true
				close(s.running)
			}
		}
		s.done <- cmd.Wait()
		close(s.done)
	}()
	return s
}

func (s *runningStage) waitRunning(b *testing.B) {
	b.Helper()
	select {
	case <-s.running:
	case err := <-s.done:
		b.Fatalf("job %d: the stage ended (%v) before it printed %q:\n%s%s", s.job.ID, err, stageRunning, s.output.String(), s.stderr.String())
	case <-time.After(2 * time.Minute):
		b.Fatalf("job %d: the stage printed no %q in 2 minutes", s.job.ID, stageRunning)
	}
}

func (s *runningStage) stillRunning(b *testing.B) {
	b.Helper()
	select {
	case err := <-s.done:
		b.Fatalf("job %d: the stage ended (%v) before the measurement did: make it sleep longer", s.job.ID, err)
	default:
	}
}

func (s *runningStage) wait(b *testing.B) {
	b.Helper()
	if err := <-s.done; err != nil {
		b.Fatalf("job %d: run: %v\n%s%s", s.job.ID, err, s.output.String(), s.stderr.String())
	}
}
