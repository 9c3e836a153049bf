//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/chartinstall"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tools/duoflow"
)

// upgradeJobs is how many jobs run through each helm upgrade and rollback, and upgradeLines how
// many numbered lines each prints once its gate opens.
const upgradeJobs, upgradeLines = 4, 300

// warmReplicas is the release's pool's replicas (chartinstall's values).
const warmReplicas = 2

// TestUpgradeUnderLoad upgrades a release while jobs run (issue 41): `helm upgrade` to new
// agent, runner and executor images and a changed template (the job pods' CPU request) with 4
// jobs held mid-stage, then `helm rollback` to revision 1 with 4 more. Each time: the claimed
// pods are not touched (same UID, no restart, still of their revision); the warm pool's
// unclaimed pods are replaced by pods of the new template; the agent CA and the egress proxy's
// admin Secrets are the same objects with the same data; the old runner pod, told to stop
// (SIGQUIT), finishes its jobs, each with its whole output exactly once, and then goes; the next
// jobs run on the new template through the new runner pod. Then uninstall leaves nothing.
//
// It runs on the local cluster's one node; the issue asks for two (claimed pods on one node,
// the rolled pools on the other), which the local cluster does not have yet.
//
// The "new" images are the same bytes as the installed ones under a second tag
// (chartinstall.TagImages): the references change, which is what makes Kubernetes and the warm
// pool roll the pods.
func TestUpgradeUnderLoad(t *testing.T) {
	t.Parallel()
	start := time.Now()
	c := clusterjobs.Connect(t)
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	tag, err := chartinstall.ImagesTag(root)
	if err != nil {
		t.Fatal(err)
	}
	next := tag + "-next"
	// Tagged before the install, so that the tags go after the uninstall (cleanups run last first).
	untag, err := chartinstall.TagImages(root, c.Env, next)
	t.Cleanup(func() {
		if untag != nil {
			if err := untag(); err != nil {
				t.Errorf("removing the images' tag %s: %v", next, err)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	suffix := strconv.Itoa(os.Getpid())
	inst, _ := duoInstance(t)
	r := installRelease(t, chartinstall.Options{Root: root, Env: c.Env, Kube: c.Admin.Kube,
		Namespace: "sbx-upgrade-" + suffix, GitLabNamespace: "sbx-upgrade-gitlab-" + suffix, Release: "up",
		InstanceIP: inst.Host, RunnerToken: inst.GitLab.RunnerToken(), JobImage: ciImage})
	t.Logf("release %s in %s (images %s, then %s)", r.Release, r.Namespace, tag, next)
	wait := jobWaiter(t, inst, r)

	rev1 := revision{number: 1, tag: tag, cpu: "50m"}
	rev2 := revision{number: 2, tag: next, cpu: "60m"}
	u := &upgrade{t: t, c: c, r: r, inst: inst, wait: wait}
	held := startHeldJobs(t, c, inst, r, ciImage, upgradeJobs, upgradeLines)
	u.assertOn(held, rev1, "")
	chart := filepath.Join(root, "deploy", "chart", "sandbox-executor")
	u.roll(held, rev1, rev2, "upgrade", r.Release, chart, "--reuse-values", "--set", "images.tag="+next, "--set", "jobDefaults.resources.requests.cpu="+rev2.cpu)
	// The next jobs, on revision 2, run through the rollback.
	held = startHeldJobs(t, c, inst, r, ciImage, upgradeJobs, upgradeLines)
	u.assertOn(held, rev2, u.runner)
	u.roll(held, rev2, rev1, "rollback", r.Release, strconv.Itoa(rev1.number))
	last := startHeldJobs(t, c, inst, r, ciImage, 1, upgradeLines)
	u.assertOn(last, rev1, u.runner)
	last[0].open(t, r)
	last[0].assertWhole(t, "after the rollback", wait)
	t.Logf("job %d after the rollback: on revision 1's template (pod %s) through runner pod %s", last[0].Job.ID, last[0].Pod.Name, u.runner)

	if err := r.Uninstall(); err != nil {
		t.Fatal(err)
	}
	assertNothingLeft(t, c, r)
	t.Logf("upgrade and rollback under load: %s in all", time.Since(start).Round(time.Second))
}

// revision is what a release revision gives job pods: the agent image's tag (images.tag) and
// the job container's CPU request (jobDefaults.resources.requests.cpu).
type revision struct {
	number   int
	tag, cpu string
}

func (v revision) String() string {
	return fmt.Sprintf("revision %d (images %s, cpu %s)", v.number, v.tag, v.cpu)
}

// agent is the agent image's reference at this revision.
func (v revision) agent() string { return "sandbox-executor.local/sandbox-executor-agent:" + v.tag }

// runner is the runner image's reference at this revision.
func (v revision) runner() string { return "sandbox-executor.local/sandbox-executor-runner:" + v.tag }

// of says how pod differs from a job pod of this revision; empty if it does not.
func (v revision) of(pod *corev1.Pod) string {
	agents := map[string]bool{}
	for _, vol := range pod.Spec.Volumes {
		if vol.Image != nil {
			agents[vol.Image.Reference] = true
		}
	}
	for _, ic := range pod.Spec.InitContainers {
		agents[ic.Image] = true
	}
	var diffs []string
	if got := slices.Sorted(maps.Keys(agents)); !slices.Equal(got, []string{v.agent()}) {
		diffs = append(diffs, fmt.Sprintf("agent image %v, want %s", got, v.agent()))
	}
	for _, ct := range pod.Spec.Containers {
		if ct.Name == "job" {
			if got := ct.Resources.Requests.Cpu().String(); got != v.cpu {
				diffs = append(diffs, fmt.Sprintf("cpu request %s, want %s", got, v.cpu))
			}
		}
	}
	return strings.Join(diffs, "; ")
}

// upgrade drives one release through helm upgrade and rollback under load.
type upgrade struct {
	t    *testing.T
	c    *clusterjobs.Cluster
	r    *chartinstall.Release
	inst *duoflow.Instance
	wait func(int64) fakegitlab.Result
	// runner is the release's current runner pod.
	runner string
}

// assertOn: the held jobs run in pods of revision v, through runner pod runner if set (their
// hand-out is in its log).
func (u *upgrade) assertOn(held []*heldJob, v revision, runner string) {
	t := u.t
	t.Helper()
	for _, h := range held {
		if diff := v.of(h.Pod); diff != "" {
			t.Errorf("job %d runs in pod %s, not of %s: %s", h.Job.ID, h.Pod.Name, v, diff)
		}
	}
	if runner != "" {
		log, err := u.r.Kubectl("-n", u.r.Namespace, "logs", runner)
		if err != nil {
			t.Fatal(err)
		}
		assertHandedTo(t, held, runner, log)
	}
}

// assertHandedTo: log, runner pod runner's, says gitlab-runner received each held job.
func assertHandedTo(t *testing.T, held []*heldJob, runner, log string) {
	t.Helper()
	log = ansiColor.ReplaceAllString(log, "")
	for _, h := range held {
		if !regexp.MustCompile(`Checking for jobs\.\.\. received +job=` + strconv.FormatInt(h.Job.ID, 10) + ` `).MatchString(log) {
			t.Errorf("job %d was not handed to runner pod %s:\n%s", h.Job.ID, runner, log)
		}
	}
}

// roll runs `helm VERB ARGS...` (upgrade or rollback, in the release's namespace) from revision
// from to revision to while the held jobs run, and asserts what it must leave and what it must replace; then it lets the jobs
// finish and checks their output, and that the old runner pod then went.
func (u *upgrade) roll(held []*heldJob, from, to revision, verb string, args ...string) {
	t, c, r := u.t, u.c, u.r
	t.Helper()
	ctx := context.Background()
	began := time.Now()
	claimed := map[types.UID]bool{}
	for _, h := range held {
		claimed[h.Pod.UID] = true
	}
	warm := u.waitWarmPods(from, claimed, nil)
	secrets := u.keptObjects()
	oldRunner := u.runnerPod(from, nil)
	// The old runner pod's log as it comes, to its end: start-runner's graceful stop.
	logs := clusterjobs.NewLive()
	follow := r.KubectlCommand("-n", r.Namespace, "logs", "-f", oldRunner.Name)
	follow.Stdout, follow.Stderr = logs, logs
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	followed := make(chan error, 1)
	go func() { followed <- follow.Wait() }()
	t.Cleanup(func() { _ = follow.Process.Kill() }) // a no-op once it has exited

	if _, err := chartinstall.Run(r.Helm, slices.Concat([]string{verb}, args, []string{"-n", r.Namespace, "--kubeconfig=" + r.Env.AdminKubeconfig()})...); err != nil {
		t.Fatal(err)
	}
	t.Logf("helm %s to %s returned after %s, %d jobs running", verb, to, time.Since(began).Round(time.Millisecond), len(held))

	rolled := u.waitWarmPods(to, claimed, warm)
	t.Logf("warm pool rolled to %s in %s: %s replaced by %s", to, time.Since(began).Round(time.Millisecond), podNames(warm), podNames(rolled))
	newRunner := u.runnerPod(to, oldRunner)
	if !logs.Wait("start-runner: stopping gitlab-runner gracefully (SIGQUIT)", inClusterTimeout) {
		t.Fatalf("runner pod %s was not stopped gracefully after helm %s:\n%s", oldRunner.Name, verb, logs)
	}
	t.Logf("runner pod %s (%s) replaced by %s (%s) in %s; the old one stops gracefully", oldRunner.Name, from.runner(), newRunner.Name, to.runner(), time.Since(began).Round(time.Millisecond))
	for _, h := range held {
		pod, err := c.Admin.Kube.CoreV1().Pods(r.Namespace).Get(ctx, h.Pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("job %d's pod %s after helm %s: %v", h.Job.ID, h.Pod.Name, verb, err)
		}
		if pod.UID != h.Pod.UID || pod.DeletionTimestamp != nil {
			t.Errorf("job %d's pod %s was replaced or is going after helm %s: uid %s (was %s), deleted at %v", h.Job.ID, pod.Name, verb, pod.UID, h.Pod.UID, pod.DeletionTimestamp)
		}
		for _, st := range slices.Concat(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses) {
			if st.RestartCount != 0 {
				t.Errorf("job %d's pod %s: container %s restarted %d times", h.Job.ID, pod.Name, st.Name, st.RestartCount)
			}
		}
		if diff := from.of(pod); diff != "" {
			t.Errorf("job %d's pod %s changed by helm %s: %s", h.Job.ID, pod.Name, verb, diff)
		}
	}
	t.Logf("%d claimed pods untouched by helm %s: %s", len(held), verb, podNames(heldPods(held)))
	after := u.keptObjects()
	for _, key := range slices.Sorted(maps.Keys(secrets)) {
		before, now := secrets[key], after[key]
		if before.uid != now.uid || !maps.EqualFunc(before.data, now.data, bytes.Equal) {
			t.Errorf("%s changed by helm %s: uid %s, was %s; same data: %v", key, verb, now.uid, before.uid, maps.EqualFunc(before.data, now.data, bytes.Equal))
		}
	}
	t.Logf("kept by helm %s with the same UIDs and data: %s", verb, strings.Join(slices.Sorted(maps.Keys(secrets)), ", "))

	for _, h := range held {
		h.open(t, r)
	}
	for _, h := range held {
		res := h.assertWhole(t, "through helm "+verb, u.wait)
		t.Logf("job %d through helm %s: %s in %s, its %d lines each once", h.Job.ID, verb, res.State, res.Duration().Round(time.Millisecond), upgradeLines)
	}
	select {
	case <-followed:
	case <-time.After(inClusterTimeout):
		t.Fatalf("runner pod %s still runs %s after its jobs ended:\n%s", oldRunner.Name, inClusterTimeout, logs)
	}
	assertHandedTo(t, held, oldRunner.Name, logs.String())
	name := oldRunner.Name
	pods := c.Admin.Kube.CoreV1().Pods(r.Namespace)
	if left := waitNoneLeft(listWatch(func(o *metav1.ListOptions) { o.FieldSelector = "metadata.name=" + name }, pods.List, pods.Watch), &corev1.Pod{}); left != nil {
		t.Fatalf("runner pod %s still there after its jobs ended: %v", name, left)
	}
	t.Logf("runner pod %s gone after its %d jobs ended; helm %s under load took %s", name, len(held), verb, time.Since(began).Round(time.Millisecond))
	u.runner = newRunner.Name
}

// waitWarmPods watches the release's warm pods until the pool holds warmReplicas Ready ones of
// revision v, none of them claimed nor in replaced, and returns them.
func (u *upgrade) waitWarmPods(v revision, claimed map[types.UID]bool, replaced []corev1.Pod) []corev1.Pod {
	t := u.t
	t.Helper()
	old := map[types.UID]bool{}
	for _, p := range replaced {
		old[p.UID] = true
	}
	var got []corev1.Pod
	done := func(s cache.Store) bool {
		got = nil
		for _, o := range s.List() {
			p := o.(*corev1.Pod)
			if p.DeletionTimestamp == nil && !claimed[p.UID] {
				got = append(got, *p)
			}
		}
		if len(got) != warmReplicas {
			return false
		}
		for i := range got {
			if old[got[i].UID] || v.of(&got[i]) != "" || !podReady(&got[i]) {
				return false
			}
		}
		return true
	}
	pods := u.c.Admin.Kube.CoreV1().Pods(u.r.Namespace)
	lw := listWatch(func(o *metav1.ListOptions) {
		o.LabelSelector = jobPodsOf(u.r) + "," + sandboxv1beta1.SandboxWarmPoolLabel
	}, pods.List, pods.Watch)
	if err := untilStore(lw, &corev1.Pod{}, done); err != nil {
		var state []string
		for i := range got {
			state = append(state, fmt.Sprintf("%s (ready %v, replaced %v) %s", got[i].Name, podReady(&got[i]), old[got[i].UID], v.of(&got[i])))
		}
		t.Fatalf("the warm pool of %s did not hold %d Ready pods of %s: %v; unclaimed pods: %v", u.r.Namespace, warmReplicas, v, err, state)
	}
	return got
}

// runnerPod watches the release's runner pods until one runs the runner image of revision v and
// is Ready, and, when old is set, old is being deleted; it returns that pod.
func (u *upgrade) runnerPod(v revision, old *corev1.Pod) *corev1.Pod {
	t := u.t
	t.Helper()
	var found *corev1.Pod
	done := func(s cache.Store) bool {
		found = nil
		oldGoing := old == nil
		for _, o := range s.List() {
			p := o.(*corev1.Pod)
			if old != nil && p.UID == old.UID {
				oldGoing = p.DeletionTimestamp != nil
				continue
			}
			if p.DeletionTimestamp == nil && podReady(p) && len(p.Spec.Containers) == 1 && p.Spec.Containers[0].Image == v.runner() {
				found = p
			}
		}
		return found != nil && oldGoing
	}
	pods := u.c.Admin.Kube.CoreV1().Pods(u.r.Namespace)
	lw := listWatch(func(o *metav1.ListOptions) {
		o.LabelSelector = "app.kubernetes.io/name=sandbox-executor-runner,app.kubernetes.io/instance=" + u.r.Release
	}, pods.List, pods.Watch)
	if err := untilStore(lw, &corev1.Pod{}, done); err != nil {
		t.Fatalf("no Ready runner pod of %s in %s (old pod %v going): %v\nrunner pod log:\n%s", v, u.r.Namespace, old != nil, err, u.r.RunnerLog())
	}
	return found
}

// keptObject is a Secret's or ConfigMap's identity and data.
type keptObject struct {
	uid  types.UID
	data map[string][]byte
}

// keptObjects are the objects an upgrade must keep as they are: the agent CA (its Secret, the
// key only runners hold, and its ConfigMap, which job pods trust) and the egress proxy's admin
// token and certificate Secrets.
func (u *upgrade) keptObjects() map[string]keptObject {
	t := u.t
	t.Helper()
	ctx := context.Background()
	ns := u.r.Namespace
	kept := map[string]keptObject{}
	for _, name := range []string{agentCA, u.r.Fullname() + "-egress-admin", u.r.Fullname() + "-egress-admin-tls"} {
		s, err := u.c.Admin.Kube.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		kept["Secret "+name] = keptObject{uid: s.UID, data: s.Data}
	}
	cm, err := u.c.Admin.Kube.CoreV1().ConfigMaps(ns).Get(ctx, agentCA, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	data := map[string][]byte{}
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	kept["ConfigMap "+agentCA] = keptObject{uid: cm.UID, data: data}
	return kept
}

// untilStore lists and watches what lw lists until done holds of it, for at most
// inClusterTimeout.
func untilStore(lw cache.ListerWatcher, obj runtime.Object, done func(cache.Store) bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), inClusterTimeout)
	defer cancel()
	var store cache.Store
	_, err := watchtools.UntilWithSync(ctx, lw, obj, func(s cache.Store) (bool, error) {
		store = s
		return done(s), nil
	}, func(watch.Event) (bool, error) { return store != nil && done(store), nil })
	return err
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func heldPods(held []*heldJob) []corev1.Pod {
	pods := make([]corev1.Pod, len(held))
	for i, h := range held {
		pods[i] = *h.Pod
	}
	return pods
}

func podNames(pods []corev1.Pod) string {
	names := make([]string, len(pods))
	for i, p := range pods {
		names[i] = p.Name
	}
	return strings.Join(names, ", ")
}
