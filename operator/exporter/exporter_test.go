package exporter_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	sandboxfake "sigs.k8s.io/agent-sandbox/clients/k8s/clientset/versioned/fake"
	extfake "sigs.k8s.io/agent-sandbox/clients/k8s/extensions/clientset/versioned/fake"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/fakecluster"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/operator/exporter"
)

func TestMain(m *testing.M) { fakecluster.VerifyNoLeaks(m) }

const (
	ns   = "sandbox-executor"
	pool = "duo-default"
)

// t0 is when the test's claims are made; the API's times have one-second resolution.
var t0 = time.Date(2026, 11, 24, 4, 0, 0, 0, time.UTC)

// fakeCluster is the three fake clientsets, with every watch started reported on watching, so
// that a test changes objects only once the informers see the changes (a fake's watch that
// starts after a change misses it).
type fakeCluster struct {
	kube       *kubefake.Clientset
	sandboxes  *sandboxfake.Clientset
	extensions *extfake.Clientset
	watching   chan string
}

func newFakeCluster(objects ...runtime.Object) *fakeCluster {
	var kubeObjs, sbxObjs, extObjs []runtime.Object
	for _, o := range objects {
		switch o.(type) {
		case *corev1.Pod:
			kubeObjs = append(kubeObjs, o)
		case *sandboxv1beta1.Sandbox:
			sbxObjs = append(sbxObjs, o)
		default:
			extObjs = append(extObjs, o)
		}
	}
	fc := &fakeCluster{
		kube:       kubefake.NewClientset(kubeObjs...),
		sandboxes:  sandboxfake.NewSimpleClientset(),
		extensions: extfake.NewSimpleClientset(extObjs...),
		watching:   make(chan string, 10),
	}
	// The fake guesses the resource "sandboxs" from the kind: add Sandboxes under their name.
	for _, o := range sbxObjs {
		sbx := o.(*sandboxv1beta1.Sandbox)
		if err := fc.sandboxes.Tracker().Create(kube.Sandboxes.WithVersion(kube.APIVersion), sbx, sbx.Namespace); err != nil {
			panic(err)
		}
	}
	for _, f := range []struct {
		fake    *k8stesting.Fake
		tracker k8stesting.ObjectTracker
	}{
		{&fc.kube.Fake, fc.kube.Tracker()},
		{&fc.sandboxes.Fake, fc.sandboxes.Tracker()},
		{&fc.extensions.Fake, fc.extensions.Tracker()},
	} {
		f.fake.PrependWatchReactor("*", func(action k8stesting.Action) (bool, watch.Interface, error) {
			w, err := f.tracker.Watch(action.GetResource(), action.GetNamespace())
			fc.watching <- action.GetResource().Resource
			return true, w, err
		})
	}
	return fc
}

func (fc *fakeCluster) clients() *kube.Clients {
	return &kube.Clients{Kube: fc.kube, Sandboxes: fc.sandboxes, Extensions: fc.extensions}
}

// events is what the observer reported, one value per job start or end.
type events struct {
	starts chan kube.JobStart
	ends   chan kube.JobEnd
}

// observe runs an Observer of the fake cluster feeding Metrics on a fresh registry, and returns
// once its four watches run. It stops when the test ends.
func observe(t *testing.T, fc *fakeCluster, now time.Time) (*prometheus.Registry, events) {
	t.Helper()
	reg := prometheus.NewRegistry()
	ev := events{starts: make(chan kube.JobStart, 10), ends: make(chan kube.JobEnd, 10)}
	var observer *kube.Observer
	m := exporter.NewMetrics(reg, func() ([]kube.PoolState, error) { return observer.Pools(now) })
	observer = fc.clients().Observe(ns,
		func(s kube.JobStart) { m.Started(s); ev.starts <- s },
		func(e kube.JobEnd) { m.Ended(e); ev.ends <- e })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); observer.Shutdown() })
	if err := observer.Run(ctx); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for len(seen) < 4 {
		seen[<-fc.watching] = true
	}
	return reg, ev
}

func warmPool(desired, total, ready int32) *extv1beta1.SandboxWarmPool {
	return &extv1beta1.SandboxWarmPool{
		ObjectMeta: metav1.ObjectMeta{Name: pool, Namespace: ns},
		Spec:       extv1beta1.SandboxWarmPoolSpec{Replicas: ptr.To(desired)},
		Status:     extv1beta1.SandboxWarmPoolStatus{Replicas: total, ReadyReplicas: ready},
	}
}

func claim(name string, created time.Time, shutdown time.Time) *extv1beta1.SandboxClaim {
	return &extv1beta1.SandboxClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-claim-" + name), CreationTimestamp: metav1.NewTime(created)},
		Spec: extv1beta1.SandboxClaimSpec{
			WarmPoolRef: extv1beta1.SandboxWarmPoolRef{Name: pool},
			Lifecycle:   &extv1beta1.Lifecycle{ShutdownTime: ptr.To(metav1.NewTime(shutdown)), ShutdownPolicy: extv1beta1.ShutdownPolicyDelete},
		},
	}
}

// readyClaim is c Ready at readyAt on the sandbox named sandbox.
func readyClaim(c *extv1beta1.SandboxClaim, sandbox string, readyAt time.Time) *extv1beta1.SandboxClaim {
	c = c.DeepCopy()
	c.Status.Conditions = []metav1.Condition{{Type: string(sandboxv1beta1.SandboxConditionReady), Status: metav1.ConditionTrue, Reason: "Ready", LastTransitionTime: metav1.NewTime(readyAt)}}
	c.Status.SandboxStatus.Name = sandbox
	return c
}

// sandbox is a Ready Sandbox owned by owner (a pool, a claim or a template), launched as launch,
// Ready since readySince.
func sandbox(name string, owner metav1.OwnerReference, launch string, readySince time.Time) *sandboxv1beta1.Sandbox {
	labels := map[string]string{sandboxv1beta1.SandboxLaunchTypeLabel: launch}
	if owner.Kind == extv1beta1.SandboxTemplateKind {
		labels[kube.LabelManagedBy] = kube.ManagedByValue
	}
	return &sandboxv1beta1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-sandbox-" + name), Labels: labels, OwnerReferences: []metav1.OwnerReference{owner}},
		Status: sandboxv1beta1.SandboxStatus{Conditions: []metav1.Condition{{
			Type: string(sandboxv1beta1.SandboxConditionReady), Status: metav1.ConditionTrue, Reason: "Ready", LastTransitionTime: metav1.NewTime(readySince),
		}}},
	}
}

func ownedBy(kind, name string, uid string) metav1.OwnerReference {
	return metav1.OwnerReference{Kind: kind, Name: name, UID: types.UID(uid), Controller: ptr.To(true)}
}

// pod is the running pod of Sandbox sandbox, its job container probed on the fence port, ready
// or not.
func pod(sandbox string, ready bool) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: sandbox, Namespace: ns, OwnerReferences: []metav1.OwnerReference{ownedBy("Sandbox", sandbox, "uid-sandbox-"+sandbox)}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name:           "job",
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/fence", Port: intstr.FromInt32(wire.FencePort)}}},
		}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
			Name: "job", Ready: ready, Started: ptr.To(true), State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
		}}},
	}
}

// The pool gauges are the pool's status and what the claims and pods say, read at scrape time;
// claims Ready before the exporter started are not counted as starts (the exporter before it
// did), and neither is an outcome recorded before it started.
func TestPoolGaugesFromTheCluster(t *testing.T) {
	now := t0.Add(time.Hour)
	poolOwner := ownedBy("SandboxWarmPool", pool, "uid-pool")
	leaked := readyClaim(claim("job-1-leaked", t0, now.Add(-time.Minute)), "sbx-leaked", t0.Add(time.Second))
	leaked.Annotations = map[string]string{kube.AnnotationOutcome: kube.OutcomeSuccess}
	fc := newFakeCluster(
		warmPool(3, 2, 1),
		sandbox("sbx-ready", poolOwner, "", t0),
		sandbox("sbx-fenced", poolOwner, "", t0),
		pod("sbx-ready", true),
		pod("sbx-fenced", false),
		leaked,
		sandbox("sbx-leaked", ownedBy("SandboxClaim", leaked.Name, string(leaked.UID)), sandboxv1beta1.SandboxLaunchTypeWarm, t0.Add(-time.Minute)),
		pod("sbx-leaked", false), // a claimed pod held out counts for its claim's pool
		claim("job-2-waiting", t0, now.Add(time.Hour)),
	)
	reg, ev := observe(t, fc, now)
	want := `
# HELP sandbox_executor_claims_past_shutdown Claims on the pool whose shutdownTime has passed: leaked, the controller should have deleted them.
# TYPE sandbox_executor_claims_past_shutdown gauge
sandbox_executor_claims_past_shutdown{pool="duo-default"} 1
# HELP sandbox_executor_pool_claims Claims on the pool: waiting (not Ready yet) or ready (running a job).
# TYPE sandbox_executor_pool_claims gauge
sandbox_executor_pool_claims{pool="duo-default",state="ready"} 1
sandbox_executor_pool_claims{pool="duo-default",state="waiting"} 1
# HELP sandbox_executor_pool_desired_sandboxes Sandboxes the pool is asked to keep (spec.replicas; the HPA's target when it scales the pool).
# TYPE sandbox_executor_pool_desired_sandboxes gauge
sandbox_executor_pool_desired_sandboxes{pool="duo-default"} 3
# HELP sandbox_executor_pool_fence_held_out_pods Pods of the pool that run but are held out of service because their egress fence check (the readiness probe) fails.
# TYPE sandbox_executor_pool_fence_held_out_pods gauge
sandbox_executor_pool_fence_held_out_pods{pool="duo-default"} 2
# HELP sandbox_executor_pool_ready_sandboxes Ready sandboxes waiting in the pool (status.readyReplicas).
# TYPE sandbox_executor_pool_ready_sandboxes gauge
sandbox_executor_pool_ready_sandboxes{pool="duo-default"} 1
# HELP sandbox_executor_pool_warming_sandboxes Sandboxes in the pool still booting (status.replicas - status.readyReplicas).
# TYPE sandbox_executor_pool_warming_sandboxes gauge
sandbox_executor_pool_warming_sandboxes{pool="duo-default"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(reg, exporter.MetricStarts, exporter.MetricJobs, exporter.MetricClaimReady); err != nil || n != 0 {
		t.Errorf("starts and outcomes from before the exporter started: %d series (%v), want none", n, err)
	}
	if len(ev.starts) != 0 || len(ev.ends) != 0 {
		t.Errorf("events from before the exporter started: %d starts, %d ends", len(ev.starts), len(ev.ends))
	}
}

// Each job is counted once: its start when its claim turns Ready (with how it got its sandbox
// and how long the claim took), its end when cleanup records its outcome, whatever else
// changes on the claim afterwards.
func TestJobsAreCountedOnceByLaunchAndOutcome(t *testing.T) {
	ctx := context.Background()
	fc := newFakeCluster(warmPool(2, 2, 2))
	reg, ev := observe(t, fc, t0.Add(time.Hour))
	claims := fc.extensions.ExtensionsV1beta1().SandboxClaims(ns)
	sandboxes := fc.sandboxes.AgentsV1beta1().Sandboxes(ns)

	// warm: the pool's sandbox was Ready a minute before the claim; the claim is Ready 1 s later.
	warm := claim("job-10-warm", t0, t0.Add(time.Hour))
	if _, err := claims.Create(ctx, warm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := sandboxes.Create(ctx, sandbox("sbx-10", ownedBy("SandboxClaim", warm.Name, string(warm.UID)), sandboxv1beta1.SandboxLaunchTypeWarm, t0.Add(-time.Minute)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := claims.Update(ctx, readyClaim(warm, "sbx-10", t0.Add(time.Second)), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := <-ev.starts; got != (kube.JobStart{Pool: pool, Launch: kube.LaunchWarm, ClaimToReady: time.Second}) {
		t.Errorf("warm start: %+v", got)
	}

	// waited: the claim turned Ready before its sandbox reached the cache, which Ready 3 s after the claim.
	waited := claim("job-11-waited", t0, t0.Add(time.Hour))
	if _, err := claims.Create(ctx, readyClaim(waited, "sbx-11", t0.Add(3*time.Second)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := sandboxes.Create(ctx, sandbox("sbx-11", ownedBy("SandboxClaim", waited.Name, string(waited.UID)), sandboxv1beta1.SandboxLaunchTypeWarm, t0.Add(3*time.Second)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := <-ev.starts; got != (kube.JobStart{Pool: pool, Launch: kube.LaunchWaited, ClaimToReady: 3 * time.Second}) {
		t.Errorf("waited start: %+v", got)
	}

	// cold: a cold_template Sandbox of the executor's own, with no claim and no pool.
	if _, err := sandboxes.Create(ctx, sandbox("job-12-cold", ownedBy(extv1beta1.SandboxTemplateKind, "duo-gvisor", "uid-template"), sandboxv1beta1.SandboxLaunchTypeCold, t0), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := <-ev.starts; got != (kube.JobStart{Launch: kube.LaunchCold}) {
		t.Errorf("cold start: %+v", got)
	}

	// Outcomes: recorded once each, the failure with its reason; later updates count nothing.
	failed := readyClaim(warm, "sbx-10", t0.Add(time.Second))
	failed.Annotations = map[string]string{kube.AnnotationOutcome: kube.OutcomeFailed, kube.AnnotationFailureReason: kube.ReasonScript}
	if _, err := claims.Update(ctx, failed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := <-ev.ends; got != (kube.JobEnd{Pool: pool, Outcome: kube.Outcome{Result: kube.OutcomeFailed, Reason: kube.ReasonScript}}) {
		t.Errorf("failed end: %+v", got)
	}
	failed.Labels = map[string]string{"touched": "again"}
	if _, err := claims.Update(ctx, failed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	succeeded := readyClaim(waited, "sbx-11", t0.Add(3*time.Second))
	succeeded.Annotations = map[string]string{kube.AnnotationOutcome: kube.OutcomeSuccess}
	if _, err := claims.Update(ctx, succeeded, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := <-ev.ends; got != (kube.JobEnd{Pool: pool, Outcome: kube.Outcome{Result: kube.OutcomeSuccess}}) {
		t.Errorf("the second end is %+v, want the success (the failure's claim was counted twice?)", got)
	}

	want := `
# HELP sandbox_executor_starts_total Jobs whose sandbox turned Ready, by pool and launch: warm (Ready in the pool before the claim), waited (the claim waited for a booting pool sandbox), cold (created for the job). pool is empty for a cold_template start.
# TYPE sandbox_executor_starts_total counter
sandbox_executor_starts_total{launch="cold",pool=""} 1
sandbox_executor_starts_total{launch="waited",pool="duo-default"} 1
sandbox_executor_starts_total{launch="warm",pool="duo-default"} 1
# HELP sandbox_executor_jobs_total Jobs whose outcome the executor recorded on their claim at cleanup, by pool, outcome (success, failed, canceled) and failure reason.
# TYPE sandbox_executor_jobs_total counter
sandbox_executor_jobs_total{outcome="failed",pool="duo-default",reason="script_failure"} 1
sandbox_executor_jobs_total{outcome="success",pool="duo-default",reason=""} 1
# HELP sandbox_executor_claim_ready_seconds Seconds from a claim's creation to its Ready condition, as the API records them (one-second resolution).
# TYPE sandbox_executor_claim_ready_seconds histogram
sandbox_executor_claim_ready_seconds_bucket{pool="duo-default",le="0.5"} 0
sandbox_executor_claim_ready_seconds_bucket{pool="duo-default",le="1"} 1
sandbox_executor_claim_ready_seconds_bucket{pool="duo-default",le="2"} 1
sandbox_executor_claim_ready_seconds_bucket{pool="duo-default",le="3"} 2
sandbox_executor_claim_ready_seconds_bucket{pool="duo-default",le="5"} 2
sandbox_executor_claim_ready_seconds_bucket{pool="duo-default",le="10"} 2
sandbox_executor_claim_ready_seconds_bucket{pool="duo-default",le="20"} 2
sandbox_executor_claim_ready_seconds_bucket{pool="duo-default",le="30"} 2
sandbox_executor_claim_ready_seconds_bucket{pool="duo-default",le="60"} 2
sandbox_executor_claim_ready_seconds_bucket{pool="duo-default",le="120"} 2
sandbox_executor_claim_ready_seconds_bucket{pool="duo-default",le="300"} 2
sandbox_executor_claim_ready_seconds_bucket{pool="duo-default",le="+Inf"} 2
sandbox_executor_claim_ready_seconds_sum{pool="duo-default"} 4
sandbox_executor_claim_ready_seconds_count{pool="duo-default"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), exporter.MetricStarts, exporter.MetricJobs, exporter.MetricClaimReady); err != nil {
		t.Error(err)
	}
}

// An exporter whose identity may not list pods says so in one line and does not start, instead
// of informers that retry forever behind an exporter that never serves.
func TestRefusedListIsOneClearError(t *testing.T) {
	fc := newFakeCluster(warmPool(1, 1, 1))
	fc.kube.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("no"))
	})
	observer := fc.clients().Observe(ns, func(kube.JobStart) {}, func(kube.JobEnd) {})
	err := observer.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "RBAC denied: cannot list pods in namespace "+ns) {
		t.Fatalf("Run: %v, want RBAC denied naming list pods", err)
	}
	observer.Shutdown()
}
