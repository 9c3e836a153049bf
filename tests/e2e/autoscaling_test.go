//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	certutil "k8s.io/client-go/util/cert"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregator "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
	"k8s.io/utils/ptr"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/poolmetrics"
	"github.com/sandbox-executor/sandbox-executor/tests/clustertest"
	"github.com/sandbox-executor/sandbox-executor/tests/localcluster"
)

// externalMetricsAPIService is the one APIService of the External metrics API on a cluster.
const externalMetricsAPIService = "v1beta1.external.metrics.k8s.io"

// e2eOwnerLabel marks the objects a test makes, so that a later run may replace its leftovers
// and nothing else.
const e2eOwnerLabel = "sandbox-executor.gitlab.io/e2e"

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

// untilHPA waits for the HPA called name to satisfy done.
func untilHPA(ctx context.Context, kc kubernetes.Interface, name, resourceVersion string, done func(*autoscalingv2.HorizontalPodAutoscaler) bool) (*autoscalingv2.HorizontalPodAutoscaler, error) {
	return untilNamed(ctx, name, resourceVersion, kc.AutoscalingV2().HorizontalPodAutoscalers(namespace).Watch, done)
}

// The cluster's HPA controller drives a SandboxWarmPool through its scale subresource: an HPA of
// the chart's shape (templates/autoscaling.yaml) on a pool of the test's own reports
// AbleToScale=True (SucceededGetScale: it read the pool's scale, replicas and selector). This
// holds with or without a metrics adapter; TestHPAScalesAPoolOnItsClaims has one and makes the
// HPA act.
func TestHPAReadsThePoolScale(t *testing.T) {
	c := clustertest.Connect(t)
	const testPool = "e2e-hpa"
	benchPool(t, c, testPool, 1)
	kc, err := kubernetes.NewForConfig(clustertest.RESTConfig(t, c.AdminKubeconfig()))
	if err != nil {
		t.Fatal(err)
	}
	created := createHPA(t, kc, poolHPA(testPool, 10))

	// The HPA controller syncs every 15 s: wait for its verdict on the pool's scale.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	got, err := untilHPA(ctx, kc, testPool, created.ResourceVersion, func(h *autoscalingv2.HorizontalPodAutoscaler) bool {
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

// startMetricsAdapter runs sandbox-executor-metrics-adapter on the node's address with the admin
// kubeconfig (for its own reads and for delegating authentication and authorization; the chart
// gives it exactly kube.ObservePermissions, auth-delegator and the authentication reader),
// serving a certificate for its Service's name, registers it (registerAdapter), and stops it
// with SIGTERM when the test ends, expecting a clean exit.
func startMetricsAdapter(t *testing.T, c *clustertest.Cluster, service string) {
	t.Helper()
	bin := c.MetricsAdapterBinary()
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s missing: make build", bin)
	}
	// The aggregator dials the Service and checks the certificate against the APIService's CA
	// bundle for the name SERVICE.NAMESPACE.svc.
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(service+"."+namespace+".svc", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	for f, data := range map[string][]byte{certFile: certPEM, keyFile: keyPEM} {
		if err := os.WriteFile(f, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	admin := c.AdminKubeconfig()
	cmd := exec.Command(bin, "--namespace", namespace, "--lister-kubeconfig", admin,
		"--authentication-kubeconfig", admin, "--authorization-kubeconfig", admin,
		"--bind-address", localcluster.NodeIP, "--secure-port", "0", "--tls-cert-file", certFile, "--tls-private-key-file", keyFile)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("metrics adapter after SIGTERM: %v\n%s", err, stderr.String())
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	m := regexp.MustCompile(`on https://\S+:(\d+)$`).FindStringSubmatch(strings.TrimSpace(line))
	if err != nil || m == nil {
		t.Fatalf("metrics adapter did not start: %q %v\n%s", line, err, stderr.String())
	}
	port, _ := strconv.Atoi(m[1])
	t.Logf("%s", strings.TrimSpace(line))
	registerAdapter(t, c, service, port, certPEM)
}

// registerAdapter makes the adapter on the host the cluster's External metrics API: a Service
// without selector whose EndpointSlice is the node's address and the adapter's port (the API
// server dials the Service's ClusterIP, which kube-proxy routes), and the APIService, trusting
// caPEM. It waits until the aggregator reports the APIService Available, and removes all three
// when the test ends.
func registerAdapter(t *testing.T, c *clustertest.Cluster, service string, port int, caPEM []byte) {
	t.Helper()
	ctx := context.Background()
	rc := clustertest.RESTConfig(t, c.AdminKubeconfig())
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	ac, err := aggregator.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	apiServices := ac.ApiregistrationV1().APIServices()
	if existing, err := apiServices.Get(ctx, externalMetricsAPIService, metav1.GetOptions{}); err == nil {
		if existing.Labels[e2eOwnerLabel] == "" {
			t.Fatalf("APIService %s already exists (service %v) and is not a test's: this test registers an adapter of its own; a cluster has only one External metrics API", externalMetricsAPIService, existing.Spec.Service)
		}
		_ = apiServices.Delete(ctx, externalMetricsAPIService, metav1.DeleteOptions{})
	}
	owner := map[string]string{e2eOwnerLabel: "autoscaling"}
	services := kc.CoreV1().Services(namespace)
	slices := kc.DiscoveryV1().EndpointSlices(namespace)
	_ = services.Delete(ctx, service, metav1.DeleteOptions{})
	_ = slices.Delete(ctx, service, metav1.DeleteOptions{})
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: service, Labels: owner},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443, TargetPort: intstr.FromInt32(int32(port))}}},
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: service, Labels: map[string]string{discoveryv1.LabelServiceName: service, e2eOwnerLabel: "autoscaling"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(int32(port)), Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{localcluster.NodeIP}}},
	}
	apiService := &apiregistrationv1.APIService{
		ObjectMeta: metav1.ObjectMeta{Name: externalMetricsAPIService, Labels: owner},
		Spec: apiregistrationv1.APIServiceSpec{
			Service:              &apiregistrationv1.ServiceReference{Namespace: namespace, Name: service, Port: ptr.To[int32](443)},
			Group:                "external.metrics.k8s.io",
			Version:              "v1beta1",
			CABundle:             caPEM,
			GroupPriorityMinimum: 100,
			VersionPriority:      100,
		},
	}
	if _, err := services.Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = services.Delete(context.Background(), service, metav1.DeleteOptions{}) })
	if _, err := slices.Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = slices.Delete(context.Background(), service, metav1.DeleteOptions{}) })
	created, err := apiServices.Create(ctx, apiService, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Runs before the Service's and the slice's cleanups: the API is gone before its backend.
	t.Cleanup(func() {
		_ = apiServices.Delete(context.Background(), externalMetricsAPIService, metav1.DeleteOptions{})
	})

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
	if _, err := untilNamed(waitCtx, externalMetricsAPIService, created.ResourceVersion, apiServices.Watch, func(a *apiregistrationv1.APIService) bool {
		cond := available(a)
		return cond != nil && cond.Status == apiregistrationv1.ConditionTrue
	}); err != nil {
		last, _ := apiServices.Get(ctx, externalMetricsAPIService, metav1.GetOptions{})
		t.Fatalf("APIService %s not Available within a minute (%v): %+v", externalMetricsAPIService, err, available(last))
	}
}

// The standard HorizontalPodAutoscaler sizes a warm pool from its claims, for real: with the
// metrics adapter behind the aggregation layer, an HPA of the chart's shape on a pool of the
// test's own (min 1, max 4, one sandbox per claim, scale-down window 5 s) raises the pool's
// spec.replicas to 3 when 3 claims are made on it, says in its status that it did so on the
// External metric, and brings the pool back to 1 once the claims are deleted. Every wait is a
// watch with a deadline; the timings are logged (docs/metrics.md), not asserted.
func TestHPAScalesAPoolOnItsClaims(t *testing.T) {
	c := clustertest.Connect(t)
	const (
		testPool = "e2e-hpa-scale"
		burst    = 3
	)
	// The cheapest sandboxes to boot: the burst's claims and the pool's refills are 2 × burst.
	templatePool(t, c, testPool, localcluster.PosixTemplate, 1)
	startMetricsAdapter(t, c, "e2e-metrics-adapter")
	kc, err := kubernetes.NewForConfig(clustertest.RESTConfig(t, c.AdminKubeconfig()))
	if err != nil {
		t.Fatal(err)
	}
	pools := c.Admin.Extensions.ExtensionsV1beta1().SandboxWarmPools(namespace)
	untilPoolReplicas := func(ctx context.Context, resourceVersion string, want int32) (*extv1beta1.SandboxWarmPool, error) {
		return untilNamed(ctx, testPool, resourceVersion, pools.Watch, func(p *extv1beta1.SandboxWarmPool) bool {
			return ptr.Deref(p.Spec.Replicas, 0) == want
		})
	}
	hpa := createHPA(t, kc, poolHPA(testPool, 5))

	// The HPA's first verdict with the adapter: the metric is valid and reads 0 claims.
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	hpa, err = untilHPA(ctx, kc, testPool, hpa.ResourceVersion, func(h *autoscalingv2.HorizontalPodAutoscaler) bool {
		active := hpaCondition(h, autoscalingv2.ScalingActive)
		return active != nil && active.Status == "True"
	})
	if err != nil {
		t.Fatalf("HPA %s: ScalingActive never True within 90 s (%v): the HPA cannot read %s through the adapter", testPool, err, poolmetrics.Claims.Name)
	}
	t.Logf("HPA %s reads the external metric: %s", testPool, hpaCondition(hpa, autoscalingv2.ScalingActive).Message)

	// The burst.
	claims := c.Admin.Extensions.ExtensionsV1beta1().SandboxClaims(namespace)
	pool, err := pools.Get(context.Background(), testPool, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	shutdown := metav1.NewTime(time.Now().Add(10 * time.Minute)) // reaped even if this test dies
	names := make([]string, burst)
	for i := range names {
		names[i] = fmt.Sprintf("%s-burst-%d", testPool, i)
		_ = claims.Delete(context.Background(), names[i], metav1.DeleteOptions{})
		claim := &extv1beta1.SandboxClaim{
			ObjectMeta: metav1.ObjectMeta{Name: names[i], Labels: map[string]string{e2eOwnerLabel: "autoscaling"}},
			Spec: extv1beta1.SandboxClaimSpec{
				WarmPoolRef: extv1beta1.SandboxWarmPoolRef{Name: testPool},
				Lifecycle:   &extv1beta1.Lifecycle{ShutdownPolicy: extv1beta1.ShutdownPolicyDelete, ShutdownTime: &shutdown},
			},
		}
		if _, err := claims.Create(context.Background(), claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = claims.Delete(context.Background(), claim.Name, metav1.DeleteOptions{}) })
	}
	burstAt := time.Now()
	ctx, cancel = context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	pool, err = untilPoolReplicas(ctx, pool.ResourceVersion, burst)
	if err != nil {
		t.Fatalf("pool %s: spec.replicas never %d within 90 s of %d claims (%v)", testPool, burst, burst, err)
	}
	grew := time.Since(burstAt)

	// The HPA says why: it scaled on the External metric, which read the burst.
	hpa, err = untilHPA(ctx, kc, testPool, hpa.ResourceVersion, func(h *autoscalingv2.HorizontalPodAutoscaler) bool {
		return h.Status.DesiredReplicas == burst && len(h.Status.CurrentMetrics) > 0
	})
	if err != nil {
		t.Fatalf("HPA %s: status never desiredReplicas %d with its current metrics (%v)", testPool, burst, err)
	}
	if able := hpaCondition(hpa, autoscalingv2.AbleToScale); able == nil || able.Status != "True" {
		t.Errorf("AbleToScale %+v, want True", able)
	}
	if active := hpaCondition(hpa, autoscalingv2.ScalingActive); active == nil || active.Status != "True" || active.Reason != "ValidMetricFound" {
		t.Errorf("ScalingActive %+v, want True (ValidMetricFound)", active)
	}
	current := hpa.Status.CurrentMetrics[0]
	if current.Type != autoscalingv2.ExternalMetricSourceType || current.External == nil || current.External.Metric.Name != poolmetrics.Claims.Name {
		t.Fatalf("HPA %s current metric %+v, want the External metric %s", testPool, current, poolmetrics.Claims.Name)
	}
	// AverageValue is the metric's sum over the pool's current replicas: burst claims in all.
	avg := current.External.Current.AverageValue
	if avg == nil || avg.MilliValue()*int64(hpa.Status.CurrentReplicas) != burst*1000 {
		t.Errorf("HPA %s: %s average %v over %d replicas, want %d claims in all", testPool, poolmetrics.Claims.Name, avg, hpa.Status.CurrentReplicas, burst)
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
		t.Fatalf("pool %s: spec.replicas never back to 1 within 90 s of deleting its claims (%v)", testPool, err)
	}
	t.Logf("shrank: spec.replicas %d -> 1 %.1f s after the claims were deleted (scale-down window 5 s, HPA sync period 15 s)", burst, time.Since(deletedAt).Seconds())
}
