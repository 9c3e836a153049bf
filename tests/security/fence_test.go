//go:build security

package security

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
)

// TestFenceFailsClosedWhileNetworkPolicyIsNotEnforced stops the NetworkPolicy controller and
// removes its rules (the outside world stays up: pods reach everything, as on a node whose
// controller crashed), and proves the fault hit: the default pool's warm pods drop out of Ready,
// because the agent's readiness check reaches the denied canary. Jobs started meanwhile must not
// be handed a pod: their prepares wait. Once enforcement is back, the same jobs run, and none of
// them reaches "the internet".
//
// The pool is the default template's without its netstack fence (a cluster whose runsc takes no
// net-raw, jobDefaults.netstackFence.enabled false): with it, a lapse of NetworkPolicy opens
// nothing (TestNetstackFenceHoldsThroughPolicyAgentRestarts) and the pods would stay Ready.
// It needs deploy/local's templates with the fence check (SANDBOX_EXECUTOR_FENCE_* and the
// readinessProbe): make cluster-up applies them.
func TestFenceFailsClosedWhileNetworkPolicyIsNotEnforced(t *testing.T) {
	c := clusterjobs.Connect(t)
	requireFenceInTemplate(t, c)
	pool := policyOnlyPool(t, c, "sec-fence-np-only", 2)
	r := c.NewRunnerWith(t, "sec-fence", localcluster.Config{
		Pools: append([]localcluster.PoolConfig{{Name: pool, Images: []string{localcluster.CIImage}}}, localcluster.Pools(localcluster.Pool)[1:]...),
		Extra: "require_fence = true",
	})
	clusterjobs.RestoreAfterBreak(t, func() error { return clusterjobs.RunScript("networkpolicy.sh", "up") })
	if err := clusterjobs.RunScript("networkpolicy.sh", "enforcement-down"); err != nil {
		t.Fatal(err)
	}
	waitPoolPodsNotReady(t, c, pool)

	jobs := []*clusterjobs.Job{r.NewJob(t, clusterjobs.JobSpec{}), r.NewJob(t, clusterjobs.JobSpec{})}
	var prepared atomic.Int32
	var wg sync.WaitGroup
	for _, j := range jobs {
		wg.Go(func() {
			defer j.Cleanup(t)
			fenceJob(t, j, &prepared)
		})
	}
	for _, j := range jobs {
		waitClaimCreated(t, c, j)
	}
	if n := prepared.Load(); n != 0 {
		t.Errorf("%d of %d jobs were handed a pod while NetworkPolicy was not enforced", n, len(jobs))
	}
	if err := clusterjobs.RunScript("networkpolicy.sh", "up"); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if n := prepared.Load(); n != int32(len(jobs)) {
		t.Errorf("%d of %d jobs got a pod once enforcement was back, want all", n, len(jobs))
	}
}

// waitPoolPodsNotReady waits until no pod of the warm pool is Ready: their readiness checks
// found the fence down.
func waitPoolPodsNotReady(t *testing.T, c *clusterjobs.Cluster, name string) {
	t.Helper()
	ctx := t.Context()
	pool, err := c.Admin.Extensions.ExtensionsV1beta1().SandboxWarmPools(clusterjobs.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var last string
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := c.Admin.Kube.CoreV1().Pods(clusterjobs.Namespace).List(ctx, metav1.ListOptions{LabelSelector: pool.Status.Selector})
		if err != nil {
			return false, err
		}
		var states []string
		for _, pod := range pods.Items {
			if podReady(&pod) {
				states = append(states, pod.Name)
			}
		}
		last = fmt.Sprintf("%d pods, still Ready: %v", len(pods.Items), states)
		return len(pods.Items) > 0 && len(states) == 0, nil
	})
	if err != nil {
		t.Fatalf("pool %s: %s (%v)", name, last, err)
	}
}

func podReady(pod *corev1.Pod) bool {
	for _, cond := range pod.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitClaimCreated waits until the job's prepare has created its claim: the job asked for a pod.
func waitClaimCreated(t *testing.T, c *clusterjobs.Cluster, j *clusterjobs.Job) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.Admin.Extensions.ExtensionsV1beta1().SandboxClaims(clusterjobs.Namespace).Get(ctx, j.ClaimName(), metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("job %d: no claim %s: %v", j.ID, j.ClaimName(), err)
	}
}

// fenceJob prepares the job and, once it has a pod, tries "the internet" first thing; reaching it
// fails the test. It runs on a goroutine of its own, so it reports with Errorf, never Fatalf.
func fenceJob(t *testing.T, j *clusterjobs.Job, prepared *atomic.Int32) {
	if !j.TryPrepare(t) {
		return
	}
	prepared.Add(1)
	res := j.Run(t, "curl -sS --connect-timeout 2 --max-time 3 http://"+internet+"/ ; echo rc=$?\n")
	if strings.Contains(res.Output(), "outside") {
		t.Errorf("job %d reached the internet (%s) from a pod it was handed:\n%s", j.ID, internet, res.Output())
	}
}

// requireFenceInTemplate fails the test unless the default pool's template configures the fence
// check: without it, this test would only show that nothing stops the jobs.
func requireFenceInTemplate(t *testing.T, c *clusterjobs.Cluster) {
	t.Helper()
	tmpl, err := c.Admin.Extensions.ExtensionsV1beta1().SandboxTemplates(clusterjobs.Namespace).Get(t.Context(), localcluster.Template, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	job := tmpl.Spec.PodTemplate.Spec.Containers[0]
	for _, e := range job.Env {
		if e.Name == wire.FenceDenyEnv && job.ReadinessProbe != nil {
			return
		}
	}
	t.Fatalf("SandboxTemplate %s has no fence check (%s, readinessProbe): apply this branch's deploy/local (make cluster-up)", tmpl.Name, wire.FenceDenyEnv)
}

// policyOnlyPool makes a copy of the default template without its netstack fence, so that
// NetworkPolicy alone fences its pods, and a warm pool of replicas on it, and waits until they
// are Ready; both go when the test ends. It returns the pool's name.
func policyOnlyPool(t *testing.T, c *clusterjobs.Cluster, name string, replicas int32) string {
	return policyOnlyPoolProbed(t, c, name, replicas, true)
}

// policyOnlyPoolProbed is policyOnlyPool; without probe, its pods have no readiness probe (the
// fence check): they stay Ready, and in their pool, while the fence is down.
func policyOnlyPoolProbed(t *testing.T, c *clusterjobs.Cluster, name string, replicas int32, probe bool) string {
	t.Helper()
	ctx := t.Context()
	templates := c.Admin.Extensions.ExtensionsV1beta1().SandboxTemplates(clusterjobs.Namespace)
	base, err := templates.Get(ctx, localcluster.Template, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &extv1beta1.SandboxTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: clusterjobs.Namespace, Labels: base.Labels},
		Spec:       *base.Spec.DeepCopy(),
	}
	pod := &tmpl.Spec.PodTemplate.Spec
	pod.InitContainers = slices.DeleteFunc(pod.InitContainers, func(c corev1.Container) bool { return c.Name == netfenceContainer })
	// Without the netstack fence, its check has no table to prove (the witness would arrive).
	pod.Containers[0].Env = slices.DeleteFunc(pod.Containers[0].Env, func(e corev1.EnvVar) bool { return e.Name == wire.FenceNetstackEnv })
	if !probe {
		pod.Containers[0].ReadinessProbe = nil
	}
	return warmPool(t, c, tmpl, replicas)
}

// warmPool creates tmpl (in clusterjobs.Namespace, replacing one of its name) and a warm pool of
// replicas of the same name on it, and waits until they are Ready; both go when the test ends.
// It returns the pool's name.
func warmPool(t *testing.T, c *clusterjobs.Cluster, tmpl *extv1beta1.SandboxTemplate, replicas int32) string {
	t.Helper()
	ctx := t.Context()
	name := tmpl.Name
	templates := c.Admin.Extensions.ExtensionsV1beta1().SandboxTemplates(clusterjobs.Namespace)
	_ = templates.Delete(ctx, name, metav1.DeleteOptions{})
	if _, err := templates.Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = templates.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	pools := c.Admin.Extensions.ExtensionsV1beta1().SandboxWarmPools(clusterjobs.Namespace)
	_ = pools.Delete(ctx, name, metav1.DeleteOptions{})
	warm := &extv1beta1.SandboxWarmPool{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: clusterjobs.Namespace},
		Spec:       extv1beta1.SandboxWarmPoolSpec{Replicas: ptr.To(replicas), TemplateRef: extv1beta1.SandboxTemplateRef{Name: name}},
	}
	if _, err := pools.Create(ctx, warm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pools.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := pools.Get(ctx, name, metav1.GetOptions{})
		return err == nil && p.Status.ReadyReplicas >= replicas, nil
	}); err != nil {
		t.Fatalf("pool %s: %d sandboxes not Ready after 3 minutes: %v", name, replicas, err)
	}
	return name
}
