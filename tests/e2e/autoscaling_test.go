//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregator "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
	"k8s.io/utils/ptr"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
	"github.com/sandbox-executor/sandbox-executor/poolmetrics"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/chartinstall"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
)

// externalMetricsAPIService is the one APIService of the External metrics API on a cluster.
const externalMetricsAPIService = "v1beta1.external.metrics.k8s.io"

// hpaCondition is the HPA's condition of type typ, or nil.
func hpaCondition(hpa *autoscalingv2.HorizontalPodAutoscaler, typ autoscalingv2.HorizontalPodAutoscalerConditionType) *autoscalingv2.HorizontalPodAutoscalerCondition {
	for i := range hpa.Status.Conditions {
		if hpa.Status.Conditions[i].Type == typ {
			return &hpa.Status.Conditions[i]
		}
	}
	return nil
}

// poolHPA is the HPA the chart renders for a pool (templates/autoscaling.yaml) with
// minReplicas 1, maxReplicas 4, one sandbox per claim, and the given scale-down window.
func poolHPA(pool string, scaleDownSeconds int32) *autoscalingv2.HorizontalPodAutoscaler {
	return &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Name: pool},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "extensions.agents.x-k8s.io/v1beta1", Kind: "SandboxWarmPool", Name: pool},
			MinReplicas:    ptr.To[int32](1),
			MaxReplicas:    4,
			Metrics: []autoscalingv2.MetricSpec{{
				Type: autoscalingv2.ExternalMetricSourceType,
				External: &autoscalingv2.ExternalMetricSource{
					Metric: autoscalingv2.MetricIdentifier{Name: poolmetrics.Claims.Name, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": pool}}},
					Target: autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: ptr.To(resource.MustParse("1"))},
				},
			}},
			Behavior: &autoscalingv2.HorizontalPodAutoscalerBehavior{
				ScaleUp:   &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: ptr.To[int32](0)},
				ScaleDown: &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: ptr.To(scaleDownSeconds)},
			},
		},
	}
}

// createHPA creates hpa in the test namespace (replacing a leftover) and deletes it when the
// test ends.
func createHPA(t *testing.T, kc kubernetes.Interface, hpa *autoscalingv2.HorizontalPodAutoscaler) *autoscalingv2.HorizontalPodAutoscaler {
	t.Helper()
	hpas := kc.AutoscalingV2().HorizontalPodAutoscalers(namespace)
	_ = hpas.Delete(context.Background(), hpa.Name, metav1.DeleteOptions{})
	created, err := hpas.Create(context.Background(), hpa, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hpas.Delete(context.Background(), hpa.Name, metav1.DeleteOptions{}) })
	return created
}

// untilNamed watches the object called name from resourceVersion until done accepts an event's
// object, and returns that object.
func untilNamed[T runtime.Object](ctx context.Context, name, resourceVersion string, watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error), done func(T) bool) (T, error) {
	selector := fields.OneTermEqualSelector("metadata.name", name).String()
	lw := &cache.ListWatch{WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		o.FieldSelector = selector
		return watchFn(ctx, o)
	}}
	var zero T
	ev, err := watchtools.Until(ctx, resourceVersion, lw, func(e watch.Event) (bool, error) {
		obj, ok := e.Object.(T)
		return ok && done(obj), nil
	})
	if err != nil {
		return zero, err
	}
	return ev.Object.(T), nil
}

// untilHPA waits for the HPA ns/name to satisfy done.
func untilHPA(ctx context.Context, kc kubernetes.Interface, ns, name, resourceVersion string, done func(*autoscalingv2.HorizontalPodAutoscaler) bool) (*autoscalingv2.HorizontalPodAutoscaler, error) {
	return untilNamed(ctx, name, resourceVersion, kc.AutoscalingV2().HorizontalPodAutoscalers(ns).Watch, done)
}

// The cluster's HPA controller drives a SandboxWarmPool through its scale subresource: an HPA of
// the chart's shape (templates/autoscaling.yaml) on a pool of the test's own reports
// AbleToScale=True (SucceededGetScale: it read the pool's scale, replicas and selector). This
// holds with or without a metrics adapter; TestHPAScalesAPoolOnItsClaims installs one and makes
// the HPA act.
func TestHPAReadsThePoolScale(t *testing.T) {
	t.Parallel()
	c := clusterjobs.Connect(t)
	const testPool = "e2e-hpa"
	benchPool(t, c, testPool, 1)
	kc, err := kubernetes.NewForConfig(clusterjobs.RESTConfig(t, c.AdminKubeconfig()))
	if err != nil {
		t.Fatal(err)
	}
	created := createHPA(t, kc, poolHPA(testPool, 10))

	// The HPA controller syncs every 15 s: wait for its verdict on the pool's scale.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	got, err := untilHPA(ctx, kc, namespace, testPool, created.ResourceVersion, func(h *autoscalingv2.HorizontalPodAutoscaler) bool {
		return hpaCondition(h, autoscalingv2.AbleToScale) != nil && hpaCondition(h, autoscalingv2.ScalingActive) != nil
	})
	if err != nil {
		t.Fatalf("the HPA controller gave HPA %s no AbleToScale and ScalingActive conditions within 2 minutes: %v", testPool, err)
	}
	able := hpaCondition(got, autoscalingv2.AbleToScale)
	if able.Status != "True" || able.Reason != "SucceededGetScale" {
		t.Errorf("AbleToScale %s (%s: %s), want True (SucceededGetScale): the HPA cannot drive the pool's scale subresource", able.Status, able.Reason, able.Message)
	}
	active := hpaCondition(got, autoscalingv2.ScalingActive)
	t.Logf("HPA %s: AbleToScale %s (%s); ScalingActive %s (%s: %s)", testPool, able.Status, able.Reason, active.Status, active.Reason, active.Message)
}

// autoscaleRelease is the chart as a user installs it for autoscaling, in a namespace of its
// own: the metrics adapter (in-cluster, its image from make images, its own RBAC and
// certificate), and one pool of the cheapest sandboxes with autoscaling, whose HPA is the
// chart's (min 1, max 4, one sandbox per claim, scale-down window 5 s).
const autoscaleValues = `images: {repository: sandbox-executor.local, tag: %q, pullPolicy: Never}
runtimeClass: {create: false, name: gvisor}
gitlab: {url: http://gitlab.sandbox.test, cidrs: [10.99.1.0/24], ports: [80]}
jobDefaults:
  fence: {deny: ["10.99.0.2:80"]}
  resources:
    requests: {cpu: 50m, memory: 64Mi, ephemeral-storage: 256Mi}
    limits: {cpu: "1", memory: 512Mi, ephemeral-storage: 1Gi}
templates:
  - {name: posix-gvisor, image: %[2]q, bakeAgent: false, command: ["sleep", "infinity"], runnerIngress: false, egress: none}
pools:
  - name: %[3]s
    template: posix-gvisor
    replicas: 1
    images: [%[2]q]
    autoscaling: {minReplicas: 1, maxReplicas: 4, claimsPerSandbox: 1, scaleDownAfterSeconds: 5}
executor: {defaultPool: %[4]s}
runner: {enabled: false}
gc: {enabled: false}
metricsAdapter: {enabled: true}
`

// installAutoscaling helm-installs autoscaleValues as release in ns, which it makes, waits for
// the adapter's APIService to be Available, and uninstalls it and deletes ns when the test ends.
// The External metrics API is the cluster's one: a leftover of an earlier run of this test is
// removed, anyone else's fails the test.
func installAutoscaling(t *testing.T, c *clusterjobs.Cluster, kc kubernetes.Interface, ns, release, pool string) {
	t.Helper()
	ctx := context.Background()
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	tag, err := chartinstall.ImagesTag(root)
	if err != nil {
		t.Fatal(err)
	}
	helm, err := chartinstall.Helm(root)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := "--kubeconfig=" + c.AdminKubeconfig()
	ac, err := aggregator.NewForConfig(clusterjobs.RESTConfig(t, c.AdminKubeconfig()))
	if err != nil {
		t.Fatal(err)
	}
	apiServices := ac.ApiregistrationV1().APIServices()
	if existing, err := apiServices.Get(ctx, externalMetricsAPIService, metav1.GetOptions{}); err == nil {
		owner := existing.Annotations["meta.helm.sh/release-namespace"]
		if owner != ns {
			t.Fatalf("APIService %s exists (service %v, release namespace %q): a cluster has one External metrics API, and this test installs its own", externalMetricsAPIService, existing.Spec.Service, owner)
		}
		_, _ = chartinstall.Run(helm, "uninstall", release, "-n", ns, "--wait", kubeconfig)
	}
	namespaces := kc.CoreV1().Namespaces()
	if leftover, err := namespaces.Get(ctx, ns, metav1.GetOptions{}); err == nil {
		if leftover.Labels[chartinstall.TestNamespaceLabel] == "" {
			t.Fatalf("namespace %s exists and is not this test's (no label %s): delete it or pick another", ns, chartinstall.TestNamespaceLabel)
		}
		_ = namespaces.Delete(ctx, ns, metav1.DeleteOptions{})
		waitNamespaceGone(t, kc, ns)
	}
	if _, err := namespaces.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "baseline", chartinstall.TestNamespaceLabel: "autoscaling"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := chartinstall.Run(helm, "uninstall", release, "-n", ns, "--wait", "--timeout", "2m", kubeconfig); err != nil {
			t.Error(err)
		}
		_ = namespaces.Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(fmt.Sprintf(autoscaleValues, tag, localcluster.PosixImage, pool, pool)), 0o600); err != nil {
		t.Fatal(err)
	}
	chart := filepath.Join(root, "deploy", "chart", "sandbox-executor")
	if _, err := chartinstall.Run(helm, "install", release, chart, "-n", ns, "-f", values, "--wait", "--timeout", "2m", kubeconfig); err != nil {
		t.Fatal(err)
	}

	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	available := func(a *apiregistrationv1.APIService) *apiregistrationv1.APIServiceCondition {
		for i := range a.Status.Conditions {
			if a.Status.Conditions[i].Type == apiregistrationv1.Available {
				return &a.Status.Conditions[i]
			}
		}
		return nil
	}
	installed, err := apiServices.Get(ctx, externalMetricsAPIService, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the chart installed no APIService %s: %v", externalMetricsAPIService, err)
	}
	if cond := available(installed); cond != nil && cond.Status == apiregistrationv1.ConditionTrue {
		return
	}
	if _, err := untilNamed(waitCtx, externalMetricsAPIService, installed.ResourceVersion, apiServices.Watch, func(a *apiregistrationv1.APIService) bool {
		cond := available(a)
		return cond != nil && cond.Status == apiregistrationv1.ConditionTrue
	}); err != nil {
		last, _ := apiServices.Get(ctx, externalMetricsAPIService, metav1.GetOptions{})
		t.Fatalf("APIService %s not Available within a minute of the install (%v): %+v", externalMetricsAPIService, err, available(last))
	}
}

// waitNamespaceGone waits until namespace ns, being deleted, is gone.
func waitNamespaceGone(t *testing.T, kc kubernetes.Interface, ns string) {
	t.Helper()
	named := func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", ns).String()
	}
	namespaces := kc.CoreV1().Namespaces()
	if left := waitNoneLeft(listWatch(named, namespaces.List, namespaces.Watch), &corev1.Namespace{}); left != nil {
		t.Fatalf("namespace %s, left by an earlier run, still there: %v", ns, left)
	}
}

// The standard HorizontalPodAutoscaler sizes a warm pool from its claims, for real and as users
// install it: the chart with metricsAdapter and a pool with autoscaling, in a namespace of the
// test's own. A burst of 3 claims on the pool makes the chart's HPA raise the pool's
// spec.replicas from 1 to 3, and its status says it did so on the External metric; once the
// claims are deleted, the HPA brings the pool back to 1. Every wait is a watch with a deadline;
// the timings are logged (docs/metrics.md), not asserted.
func TestHPAScalesAPoolOnItsClaims(t *testing.T) {
	// Serial: it installs the cluster's one External metrics APIService; until that is up, discovery fails cluster-wide.
	c := clusterjobs.Connect(t)
	const (
		ns       = "e2e-autoscale"
		testPool = "burst"
		burst    = 3
	)
	kc, err := kubernetes.NewForConfig(clusterjobs.RESTConfig(t, c.AdminKubeconfig()))
	if err != nil {
		t.Fatal(err)
	}
	installAutoscaling(t, c, kc, ns, "autoscale", testPool)
	pools := c.Admin.Extensions.ExtensionsV1beta1().SandboxWarmPools(ns)
	untilPoolReplicas := func(ctx context.Context, resourceVersion string, want int32) (*extv1beta1.SandboxWarmPool, error) {
		return untilNamed(ctx, testPool, resourceVersion, pools.Watch, func(p *extv1beta1.SandboxWarmPool) bool {
			return ptr.Deref(p.Spec.Replicas, 0) == want
		})
	}

	// The HPA's first verdict with the adapter: the metric is valid (it reads 0 claims).
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	scalingActive := func(h *autoscalingv2.HorizontalPodAutoscaler) bool {
		active := hpaCondition(h, autoscalingv2.ScalingActive)
		return active != nil && active.Status == "True"
	}
	hpa, err := kc.AutoscalingV2().HorizontalPodAutoscalers(ns).Get(ctx, testPool, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the chart made no HPA for pool %s: %v", testPool, err)
	}
	if !scalingActive(hpa) {
		hpa, err = untilHPA(ctx, kc, ns, testPool, hpa.ResourceVersion, scalingActive)
	}
	if err != nil {
		t.Fatalf("HPA %s/%s: ScalingActive never True within 90 s (%v): the HPA cannot read %s through the adapter", ns, testPool, err, poolmetrics.Claims.Name)
	}
	t.Logf("HPA %s/%s reads the external metric: %s", ns, testPool, hpaCondition(hpa, autoscalingv2.ScalingActive).Message)

	// The burst.
	claims := c.Admin.Extensions.ExtensionsV1beta1().SandboxClaims(ns)
	pool, err := pools.Get(context.Background(), testPool, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := ptr.Deref(pool.Spec.Replicas, 0); got != 1 {
		t.Fatalf("pool %s/%s: spec.replicas %d before the burst, want the HPA's minimum 1", ns, testPool, got)
	}
	shutdown := metav1.NewTime(time.Now().Add(10 * time.Minute)) // reaped even if this test dies
	names := make([]string, burst)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", testPool, i)
		claim := &extv1beta1.SandboxClaim{
			ObjectMeta: metav1.ObjectMeta{Name: names[i]},
			Spec: extv1beta1.SandboxClaimSpec{
				WarmPoolRef: extv1beta1.SandboxWarmPoolRef{Name: testPool},
				Lifecycle:   &extv1beta1.Lifecycle{ShutdownPolicy: extv1beta1.ShutdownPolicyDelete, ShutdownTime: &shutdown},
			},
		}
		if _, err := claims.Create(context.Background(), claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	burstAt := time.Now()
	ctx, cancel = context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	pool, err = untilPoolReplicas(ctx, pool.ResourceVersion, burst)
	if err != nil {
		t.Fatalf("pool %s/%s: spec.replicas never %d within 90 s of %d claims (%v)", ns, testPool, burst, burst, err)
	}
	grew := time.Since(burstAt)

	// The HPA says why: it scaled on the External metric, which read the burst.
	hpa, err = untilHPA(ctx, kc, ns, testPool, hpa.ResourceVersion, func(h *autoscalingv2.HorizontalPodAutoscaler) bool {
		return h.Status.DesiredReplicas == burst && len(h.Status.CurrentMetrics) > 0
	})
	if err != nil {
		t.Fatalf("HPA %s/%s: status never desiredReplicas %d with its current metrics (%v)", ns, testPool, burst, err)
	}
	if able := hpaCondition(hpa, autoscalingv2.AbleToScale); able == nil || able.Status != "True" {
		t.Errorf("AbleToScale %+v, want True", able)
	}
	if active := hpaCondition(hpa, autoscalingv2.ScalingActive); active == nil || active.Status != "True" || active.Reason != "ValidMetricFound" {
		t.Errorf("ScalingActive %+v, want True (ValidMetricFound)", active)
	}
	current := hpa.Status.CurrentMetrics[0]
	if current.Type != autoscalingv2.ExternalMetricSourceType || current.External == nil || current.External.Metric.Name != poolmetrics.Claims.Name {
		t.Fatalf("HPA %s/%s current metric %+v, want the External metric %s", ns, testPool, current, poolmetrics.Claims.Name)
	}
	// AverageValue is the metric's sum over the pool's current replicas: burst claims in all.
	avg := current.External.Current.AverageValue
	if avg == nil || avg.MilliValue()*int64(hpa.Status.CurrentReplicas) != burst*1000 {
		t.Errorf("HPA %s/%s: %s average %v over %d replicas, want %d claims in all", ns, testPool, poolmetrics.Claims.Name, avg, hpa.Status.CurrentReplicas, burst)
	}
	t.Logf("grew: spec.replicas 1 -> %d %.1f s after %d claims (HPA: %s)", burst, grew.Seconds(), burst, hpaCondition(hpa, autoscalingv2.AbleToScale).Message)

	// After the burst: the claims go, and after its scale-down window the HPA hands back.
	for _, name := range names {
		if err := claims.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	deletedAt := time.Now()
	ctx, cancel = context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if _, err := untilPoolReplicas(ctx, pool.ResourceVersion, 1); err != nil {
		t.Fatalf("pool %s/%s: spec.replicas never back to 1 within 90 s of deleting its claims (%v)", ns, testPool, err)
	}
	t.Logf("shrank: spec.replicas %d -> 1 %.1f s after the claims were deleted (scale-down window 5 s, HPA sync period 15 s)", burst, time.Since(deletedAt).Seconds())
}
