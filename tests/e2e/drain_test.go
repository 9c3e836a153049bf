//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/chartinstall"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tools/duoflow"
)

// jobPodsOf selects the job pods of release r (the chart's SandboxTemplates label them so).
func jobPodsOf(r *chartinstall.Release) string {
	return "app.kubernetes.io/name=sandbox-executor-job,app.kubernetes.io/instance=" + r.Release
}

// startDrain starts docs/install.md's drain of node (#draining-a-node) and returns its live output
// and its end; the node is uncordoned when the test ends. The local cluster's only node also runs
// the control plane's add-ons and the other suites' pools, so the drain is narrowed to release
// r's job pods (--pod-selector).
func startDrain(t *testing.T, r *chartinstall.Release, node string) (*clusterjobs.Live, <-chan error) {
	t.Helper()
	drain := r.KubectlCommand("drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=10m", "--pod-selector="+jobPodsOf(r))
	out := clusterjobs.NewLive()
	drain.Stdout, drain.Stderr = out, out
	t.Cleanup(func() {
		if _, err := r.Kubectl("uncordon", node); err != nil {
			t.Errorf("uncordoning node %s: %v", node, err)
		}
	})
	if err := drain.Start(); err != nil {
		t.Fatal(err)
	}
	drained := make(chan error, 1)
	go func() { drained <- drain.Wait() }()
	t.Cleanup(func() { _ = drain.Process.Kill() }) // a no-op once it has exited
	return out, drained
}

// assertDrainWaitsForRunningJob drains the node under a running job of release r with
// docs/install.md's command (#draining-a-node): the release's warm pods are evicted at once, the
// job's pod is not (kubectl reports the refusal), the job finishes with its whole output, and
// the drain completes after it. The node is uncordoned afterwards.
func assertDrainWaitsForRunningJob(t *testing.T, c *clusterjobs.Cluster, inst *duoflow.Instance, r *chartinstall.Release, image string, wait func(int64) fakegitlab.Result) {
	t.Helper()
	ctx := context.Background()
	ns := r.Namespace
	held := startHeldJobs(t, c, inst, r, image, 1, 500)[0]
	job, pod, p := held.Job, held.Pod.Name, held.Pod
	node := p.Spec.NodeName
	warm, err := c.Admin.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{
		LabelSelector: jobPodsOf(r) + "," + sandboxv1beta1.SandboxWarmPoolLabel, FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	if len(warm.Items) == 0 {
		t.Fatalf("release %s has no warm pod on node %s: nothing would show a drain moving them", r.Release, node)
	}

	out, drained := startDrain(t, r, node)

	for _, w := range warm.Items {
		if !out.Wait("pod/"+w.Name+" evicted", 2*time.Minute) {
			t.Fatalf("the drain did not evict warm pod %s:\n%s", w.Name, out)
		}
	}
	// kubectl retries a refused eviction every 5 s and says why each time.
	refused := fmt.Sprintf("error when evicting pods/%q -n %q (will retry after 5s): Cannot evict pod as it would violate the pod's disruption budget", pod, ns)
	if !out.Wait(refused, 2*time.Minute) {
		t.Fatalf("the drain was not refused job %d's pod %s:\n%s", job.ID, pod, out)
	}
	select {
	case err := <-drained:
		t.Fatalf("the drain ended (%v) while job %d ran in pod %s:\n%s", err, job.ID, pod, out)
	default:
	}
	held.open(t, r)
	res := held.assertWhole(t, "under the drain", wait)
	select {
	case err := <-drained:
		if err != nil || !strings.Contains(out.String(), "node/"+node+" drained") {
			t.Fatalf("the drain after job %d ended: %v\n%s", job.ID, err, out)
		}
	case <-time.After(inClusterTimeout):
		t.Fatalf("the drain did not complete after job %d ended:\n%s", job.ID, out)
	}
	if _, err := r.Kubectl("uncordon", node); err != nil {
		t.Fatal(err)
	}
	t.Logf("drain of %s: %d warm pods evicted at once, job %d's pod %s refused until the job ended (%s)", node, len(warm.Items), job.ID, pod, res.State)
}

// assertDrainBoundEndsJob sets drain.runningJobTimeout to 1s (helm upgrade --reuse-values, as an
// admin changes one value) and drains the node under a job that would never end: gc, run from
// the release's CronJob, marks the job's claim when it first sees the node cordoned and, on a
// later run past the bound, ends the job, which fails as a system failure whose one line names
// the drain; then the drain completes. The node is uncordoned and gc's Jobs deleted after; the
// value stays (TestDocumentedInstall uninstalls the release next).
func assertDrainBoundEndsJob(t *testing.T, c *clusterjobs.Cluster, inst *duoflow.Instance, r *chartinstall.Release, image string, wait func(int64) fakegitlab.Result) {
	t.Helper()
	ctx := context.Background()
	ns := r.Namespace
	// The local cluster has one node, which the drain cordons: gc's pods tolerate the cordon
	// (gc.tolerations) to run there, where a user's run on another node.
	if _, err := chartinstall.Run(r.Helm, "upgrade", r.Release, filepath.Join(r.Root, "deploy", "chart", "sandbox-executor"), "-n", ns,
		"--reuse-values", "--set", "drain.runningJobTimeout=1s",
		"--set-json", `gc.tolerations=[{"key":"node.kubernetes.io/unschedulable","operator":"Exists","effect":"NoSchedule"}]`,
		"--wait", "--timeout", "3m", "--kubeconfig="+r.Env.AdminKubeconfig()); err != nil {
		t.Fatalf("helm upgrade with drain.runningJobTimeout=1s: %v", err)
	}

	job := inst.GitLab.NewJob(fakegitlab.JobSpec{Image: image, GitStrategy: "none", Script: []string{
		"echo holding-the-drain",
		"while :; do sleep 0.2; done",
	}})
	inst.GitLab.Enqueue(job)
	started, cancel := context.WithTimeout(ctx, inClusterTimeout)
	res, err := inst.GitLab.WaitForTrace(started, job.ID, "holding-the-drain")
	cancel()
	if err != nil {
		t.Fatalf("job %d never started its stage: %v\n%s\nrunner pod log:\n%s", job.ID, err, res.Trace, r.RunnerLog())
	}
	claims, err := c.Admin.Extensions.ExtensionsV1beta1().SandboxClaims(ns).List(ctx, metav1.ListOptions{LabelSelector: kube.LabelJobID + "=" + strconv.FormatInt(job.ID, 10)})
	if err != nil || len(claims.Items) != 1 {
		t.Fatalf("job %d: its claim in %s: %v (%d found)", job.ID, ns, err, len(claims.Items))
	}
	claim := claims.Items[0].Name
	pod := podOfClaim(t, c, &claims.Items[0])
	p, err := c.Admin.Kube.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node := p.Spec.NodeName

	out, drained := startDrain(t, r, node)
	if !out.Wait(fmt.Sprintf("error when evicting pods/%q -n %q", pod, ns), 2*time.Minute) {
		t.Fatalf("the drain was not refused job %d's pod %s:\n%s", job.ID, pod, out)
	}

	// gc's first run sees the cordon and marks the claim; a run at least 1 s later ends the job.
	// Each run is a Job that starts a pod, which takes longer than that; should one not, the
	// next run ends it. (The CronJob's own schedule, every 15 minutes, may run gc in between:
	// then a run of ours finds the mark made.) A run that neither holds nor ends it fails.
	held := fmt.Sprintf("drain held: %s/%s (job %d, pod %s on node %s)", ns, claim, job.ID, pod, node)
	ended := fmt.Sprintf("ended %s/%s (job %d, pod %s on node %s): it held the drain past 1s", ns, claim, job.ID, pod, node)
	var gcLogs []string
	for run := 1; ; run++ {
		log := runGC(t, r, fmt.Sprintf("gc-drain-%d", run))
		gcLogs = append(gcLogs, log)
		if strings.Contains(log, ended) {
			break
		}
		if !strings.Contains(log, held) || run == 3 {
			t.Fatalf("gc run %d neither holds nor ends job %d:\n%s", run, job.ID, strings.Join(gcLogs, "\n"))
		}
	}

	res = wait(job.ID)
	if res.State != fakegitlab.StateFailed || res.FailureReason != fakegitlab.FailureSystem {
		t.Fatalf("job %d past the drain bound: %s (%s), want a system failure\n%s", job.ID, res.State, res.FailureReason, res.Trace)
	}
	mustContain(t, "trace", res.Trace, "node "+node+" is being drained and this job held the drain past drain.runningJobTimeout (1s, since ")
	select {
	case err := <-drained:
		if err != nil || !strings.Contains(out.String(), "node/"+node+" drained") {
			t.Fatalf("the drain after job %d ended: %v\n%s", job.ID, err, out)
		}
	case <-time.After(inClusterTimeout):
		t.Fatalf("the drain did not complete after gc ended job %d:\n%s", job.ID, out)
	}
	waitClaimsGone(t, c, ns, kube.LabelJobID+"="+strconv.FormatInt(job.ID, 10))
	t.Logf("drain of %s with drain.runningJobTimeout=1s: gc ended job %d after %d runs; %s", node, job.ID, len(gcLogs), failureLine(res.Trace, "is being drained"))
}

// runGC runs the release's gc once, as a Job made from its CronJob, and returns its log; the Job
// is deleted after.
func runGC(t *testing.T, r *chartinstall.Release, name string) string {
	t.Helper()
	ns := r.Namespace
	kubectl := func(args ...string) string {
		t.Helper()
		out, err := r.Kubectl(append([]string{"-n", ns}, args...)...)
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	kubectl("create", "job", name, "--from=cronjob/"+r.Fullname()+"-gc")
	defer kubectl("delete", "job", name, "--wait")
	kubectl("wait", "--for=condition=complete", "--timeout=3m", "job/"+name)
	return kubectl("logs", "job/"+name)
}

// failureLine is the trace's line that contains s, for the test's log.
func failureLine(trace, s string) string {
	for line := range strings.Lines(trace) {
		if strings.Contains(line, s) {
			return strings.TrimSpace(line)
		}
	}
	return ""
}
