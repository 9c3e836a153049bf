//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/chartinstall"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tools/duoflow"
)

// inClusterTimeout bounds one step: an install until a job is handed out (image start,
// registration), a job, a cleanup.
const inClusterTimeout = 5 * time.Minute

// TestInClusterInstall installs the chart into a namespace of its own (tests/harness/chartinstall), where
// the runner pod registers with the fake GitLab by a cluster DNS name and runs a Duo-shaped job,
// a failing job and a canceled one in gVisor pods over the pod network; then gc, started from
// its CronJob, reaps an expired claim; then helm uninstall leaves nothing behind.
func TestInClusterInstall(t *testing.T) {
	t.Parallel()
	c := clusterjobs.Connect(t)
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	suffix := strconv.Itoa(os.Getpid())
	inst, base := duoInstance(t)
	r := installRelease(t, chartinstall.Options{Root: root, Env: c.Env, Kube: c.Admin.Kube,
		Namespace: "sbx-incluster-" + suffix, GitLabNamespace: "sbx-incluster-gitlab-" + suffix, Release: "duo",
		InstanceIP: inst.Host, RunnerToken: inst.GitLab.RunnerToken(), JobImage: ciImage})
	ns := r.Namespace
	t.Logf("release %s in %s (images %s); GitLab instance %s as %s", r.Release, ns, r.Tag, inst.GitLab.URL(), r.GitLabURL)
	kubectl := func(args ...string) string {
		t.Helper()
		out, err := r.Kubectl(args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	wait := jobWaiter(t, inst, r)

	// A Duo-shaped job: clone, npm install from the instance, tests, a push back, an artifact.
	duo := inst.Job(base, ciImage)
	inst.GitLab.Enqueue(duo)
	res := wait(duo.ID)
	if res.State != fakegitlab.StateSuccess {
		t.Fatalf("Duo job %d: %s (%s)\n%s\nrunner pod log:\n%s", duo.ID, res.State, res.FailureReason, res.Trace, r.RunnerLog())
	}
	mustContain(t, "Duo job trace", res.Trace,
		"Sandbox ready: pool duo-default", "pod "+ns+"/", "runtime "+ns+"-"+r.Fullname()+"-gvisor", "stages over pod network",
		"tests passed: welcome, farewell", "Uploading artifacts", "egress to the instance: allowed", "egress outside: blocked")
	branch := duoflow.Branch(duo.ID)
	assertArtifact(t, res, "pushed "+assertPushed(t, inst, branch, base)+" on "+branch)
	if res.Runner.Version != "17.9.0" {
		t.Errorf("the job ran on gitlab-runner %q, want 17.9.0", res.Runner.Version)
	}
	assertNoMaskedValues(t, duo, res.Trace)
	waitClaimsGone(t, c, ns, kube.LabelJobID+"="+strconv.FormatInt(duo.ID, 10))
	// The chart's start-runner served prepare and cleanup (runner.stageServer): their lines are
	// in the runner pod's log, never a stage's fallback to its own process in the trace.
	mustContain(t, "runner pod log", r.WholeRunnerLog(), "stage server: listening on ", "stage server: prepare exited 0", "stage server: cleanup exited 0")
	if strings.Contains(res.Trace, "runs in its own process") {
		t.Errorf("a stage of job %d did not reach the stage server:\n%s", duo.ID, res.Trace)
	}
	t.Logf("Duo job %d: %s in %s; %s", duo.ID, res.State, res.Duration().Round(time.Millisecond), sandboxReady.FindString(res.Trace))

	assertFailingJob(t, c, inst, ns, ciImage, wait)
	assertCanceledJob(t, c, inst, ns, ciImage, wait, r.RunnerLog)

	// gc from its CronJob: an expired claim of this runner that agent-sandbox keeps (policy
	// Retain), as one left by a runner that died, is deleted; gc runs as its own ServiceAccount.
	expired := expiredClaim(t, c, ns)
	gcJob := "gc-now-" + suffix
	kubectl("-n", ns, "create", "job", gcJob, "--from=cronjob/"+r.Fullname()+"-gc")
	kubectl("-n", ns, "wait", "--for=condition=complete", "--timeout=3m", "job/"+gcJob)
	gcLog := kubectl("-n", ns, "logs", "job/"+gcJob)
	mustContain(t, "gc log", gcLog, "deleted "+ns+"/"+expired+" ", "shutdownTime passed", fmt.Sprintf("of runner %q deleted", chartinstall.RunnerName))
	waitClaimsGone(t, c, ns, "metadata.name="+expired)
	t.Logf("gc: %s", strings.TrimSpace(gcLog))

	// Uninstall: nothing of the release is left, in its namespace or cluster-wide.
	if err := r.Uninstall(); err != nil {
		t.Fatal(err)
	}
	assertNothingLeft(t, c, r)
}

// installRelease installs the chart as o says (chartinstall.Install); when the test ends, the
// release is uninstalled unless it was, and its namespaces deleted.
func installRelease(t *testing.T, o chartinstall.Options) *chartinstall.Release {
	t.Helper()
	r, err := chartinstall.Install(context.Background(), o)
	if r != nil {
		t.Cleanup(func() {
			if !r.Uninstalled() {
				_ = r.Uninstall()
			}
			if err := r.Close(); err != nil {
				t.Error(err)
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// jobWaiter waits for a job of inst run by release r to end, within inClusterTimeout, and fails
// the test with its trace so far and the runner pod's log if it does not.
func jobWaiter(t *testing.T, inst *duoflow.Instance, r *chartinstall.Release) func(int64) fakegitlab.Result {
	return func(id int64) fakegitlab.Result {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), inClusterTimeout)
		defer cancel()
		res, err := inst.GitLab.Wait(ctx, id)
		if err != nil {
			t.Fatalf("job %d: %v\ntrace so far:\n%s\nrunner pod log:\n%s", id, err, res.Trace, r.RunnerLog())
		}
		return res
	}
}

// assertNoMaskedValues: no masked variable of job appears in its trace.
func assertNoMaskedValues(t *testing.T, job fakegitlab.Job, trace string) {
	t.Helper()
	for _, v := range job.Variables {
		if v.Masked && strings.Contains(trace, v.Value) {
			t.Errorf("the value of %s appears in the trace", v.Key)
		}
	}
}

// assertFailingJob: a job in image whose script exits 3 reaches GitLab as a script failure with
// that code, and its claim in ns goes.
func assertFailingJob(t *testing.T, c *clusterjobs.Cluster, inst *duoflow.Instance, ns, image string, wait func(int64) fakegitlab.Result) {
	t.Helper()
	failing := inst.GitLab.NewJob(fakegitlab.JobSpec{Image: image, GitStrategy: "none", Script: []string{"echo about to fail", "exit 3"}})
	inst.GitLab.Enqueue(failing)
	res := wait(failing.ID)
	if res.State != fakegitlab.StateFailed || res.FailureReason != "script_failure" {
		t.Errorf("failing job %d: %s (%s), want failed (script_failure)\n%s", failing.ID, res.State, res.FailureReason, res.Trace)
	}
	mustContain(t, "failing job trace", res.Trace, "about to fail", "ERROR: Job failed: exit status 3")
	waitClaimsGone(t, c, ns, kube.LabelJobID+"="+strconv.FormatInt(failing.ID, 10))
}

// assertCanceledJob: GitLab cancels a job in image while its stage runs; the runner stops it,
// GitLab has it canceled before the stage ended, and cleanup releases its claim in ns.
func assertCanceledJob(t *testing.T, c *clusterjobs.Cluster, inst *duoflow.Instance, ns, image string, wait func(int64) fakegitlab.Result, runnerLog func() string) {
	t.Helper()
	canceled := inst.GitLab.NewJob(fakegitlab.JobSpec{Image: image, GitStrategy: "none", Script: []string{"echo waiting-for-cancel", "sleep 600", "echo NOT-CANCELED"}})
	inst.GitLab.Enqueue(canceled)
	ctx, cancel := context.WithTimeout(context.Background(), inClusterTimeout)
	res, err := inst.GitLab.WaitForTrace(ctx, canceled.ID, "waiting-for-cancel")
	cancel()
	if err != nil {
		t.Fatalf("job %d never started its stage: %v\n%s\nrunner pod log:\n%s", canceled.ID, err, res.Trace, runnerLog())
	}
	if err := inst.GitLab.Cancel(canceled.ID); err != nil {
		t.Fatal(err)
	}
	res = wait(canceled.ID)
	if res.State != fakegitlab.StateCanceled || strings.Contains(res.Trace, "NOT-CANCELED") {
		t.Errorf("canceled job %d: %s, want canceled before the stage ended\n%s", canceled.ID, res.State, res.Trace)
	}
	waitClaimsGone(t, c, ns, kube.LabelJobID+"="+strconv.FormatInt(canceled.ID, 10))
}

// expiredClaim creates a claim labelled as the runner's, whose shutdownTime has passed, with
// policy Retain so that agent-sandbox keeps it: only gc removes it. Returns its name.
func expiredClaim(t *testing.T, c *clusterjobs.Cluster, ns string) string {
	t.Helper()
	name := "expired-" + strconv.FormatInt(fakegitlab.NextJobID(), 10)
	claim := &extv1beta1.SandboxClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			kube.LabelManagedBy: kube.ManagedByValue, kube.LabelRunner: kube.RunnerLabel(chartinstall.RunnerName), kube.LabelJobID: "0"}},
		Spec: extv1beta1.SandboxClaimSpec{
			WarmPoolRef: extv1beta1.SandboxWarmPoolRef{Name: "duo-default"},
			Lifecycle: &extv1beta1.Lifecycle{ShutdownPolicy: extv1beta1.ShutdownPolicyRetain,
				ShutdownTime: ptr.To(metav1.NewTime(time.Now().Add(-time.Hour)))},
		},
	}
	if _, err := c.Admin.Extensions.ExtensionsV1beta1().SandboxClaims(ns).Create(context.Background(), claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

// waitClaimsGone watches the claims of ns that match selector (a label selector, or
// metadata.name=NAME) until there are none.
func waitClaimsGone(t *testing.T, c *clusterjobs.Cluster, ns, selector string) {
	t.Helper()
	narrow := func(o *metav1.ListOptions) {
		if name, ok := strings.CutPrefix(selector, "metadata.name="); ok {
			o.FieldSelector = "metadata.name=" + name
		} else {
			o.LabelSelector = selector
		}
	}
	claims := c.Admin.Extensions.ExtensionsV1beta1().SandboxClaims(ns)
	lw := listWatch(narrow, claims.List, claims.Watch)
	if left := waitNoneLeft(lw, &extv1beta1.SandboxClaim{}); left != nil {
		t.Fatalf("claims of %s with %s still there after %s: %v", ns, selector, inClusterTimeout, left)
	}
}

// listWatch lists and watches with list and watch, each call's options first narrowed.
func listWatch[L runtime.Object](narrow func(*metav1.ListOptions), list func(context.Context, metav1.ListOptions) (L, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) *cache.ListWatch {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			narrow(&o)
			return list(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			narrow(&o)
			return watchFn(ctx, o)
		},
	}
}

// waitNoneLeft watches what lw lists until nothing is left, and returns the names still there
// if that does not happen within inClusterTimeout.
func waitNoneLeft(lw cache.ListerWatcher, obj runtime.Object) []string {
	ctx, cancel := context.WithTimeout(context.Background(), inClusterTimeout)
	defer cancel()
	var store cache.Store
	empty := func() bool { return store != nil && len(store.List()) == 0 }
	_, err := watchtools.UntilWithSync(ctx, lw, obj, func(s cache.Store) (bool, error) {
		store = s
		return empty(), nil
	}, func(watch.Event) (bool, error) { return empty(), nil })
	if err == nil {
		return nil
	}
	names := []string{err.Error()}
	if store != nil {
		names = store.ListKeys()
	}
	return names
}

// assertNothingLeft: after helm uninstall, no object with the release's labels is left in any
// namespace or cluster-wide, and the namespace holds no claim, sandbox or pod.
func assertNothingLeft(t *testing.T, c *clusterjobs.Cluster, r *chartinstall.Release) {
	t.Helper()
	// The warm pools' sandboxes, and the pods of sandboxes and of the runner, go after helm
	// returns (garbage collection, graceful termination): watch until none is left.
	all := func(*metav1.ListOptions) {}
	sandboxes := c.Admin.Sandboxes.AgentsV1beta1().Sandboxes(r.Namespace)
	if left := waitNoneLeft(listWatch(all, sandboxes.List, sandboxes.Watch), &sandboxv1beta1.Sandbox{}); left != nil {
		t.Errorf("sandboxes left in %s after helm uninstall: %v", r.Namespace, left)
	}
	pods := c.Admin.Kube.CoreV1().Pods(r.Namespace)
	if left := waitNoneLeft(listWatch(all, pods.List, pods.Watch), &corev1.Pod{}); left != nil {
		t.Errorf("pods left in %s after helm uninstall: %v", r.Namespace, left)
	}
	// Another release of the same name may live in another namespace (the local cluster's own
	// is sandbox-executor): look in the release's namespace, and at the cluster-scoped objects
	// named after it.
	release := "app.kubernetes.io/instance=" + r.Release + ",app.kubernetes.io/part-of=sandbox-executor"
	namespaced := "all,configmaps,secrets,serviceaccounts,roles,rolebindings,networkpolicies,cronjobs,poddisruptionbudgets," +
		"sandboxtemplates.extensions.agents.x-k8s.io,sandboxwarmpools.extensions.agents.x-k8s.io"
	// The lists are stdout: kubectl names every object it found there, and warns on stderr of
	// what it could not discover (another test's API group coming or going), which is no object.
	left, warnings, err := r.KubectlOutput("get", namespaced, "-n", r.Namespace, "-o", "name", "-l", release)
	if err != nil {
		t.Fatal(err)
	}
	clusterScoped, clusterWarnings, err := r.KubectlOutput("get", "clusterroles,clusterrolebindings,runtimeclasses,validatingadmissionpolicies,validatingadmissionpolicybindings,namespaces,apiservices",
		"-o", "name", "-l", release)
	if err != nil {
		t.Fatal(err)
	}
	if w := strings.TrimSpace(warnings + clusterWarnings); w != "" {
		t.Logf("kubectl warned while listing what release %s left:\n%s", r.Release, w)
	}
	for _, name := range strings.Fields(clusterScoped) {
		if strings.Contains(name, r.Namespace) {
			left += name + "\n"
		}
	}
	if strings.TrimSpace(left) != "" {
		t.Errorf("objects of release %s left after helm uninstall:\n%s", r.Release, left)
	}
	ns := r.Namespace
	claims, err := c.Admin.Extensions.ExtensionsV1beta1().SandboxClaims(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(claims.Items) > 0 {
		t.Errorf("%d claims left in %s after helm uninstall", len(claims.Items), ns)
	}
}
