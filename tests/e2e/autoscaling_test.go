//go:build e2e

package e2e

import (
	"context"
	"testing"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"

	"github.com/sandbox-executor/sandbox-executor/tests/clustertest"
)

// hpaCondition is the HPA's condition of type typ, or nil.
func hpaCondition(hpa *autoscalingv2.HorizontalPodAutoscaler, typ autoscalingv2.HorizontalPodAutoscalerConditionType) *autoscalingv2.HorizontalPodAutoscalerCondition {
	for i := range hpa.Status.Conditions {
		if hpa.Status.Conditions[i].Type == typ {
			return &hpa.Status.Conditions[i]
		}
	}
	return nil
}

// The cluster's HPA controller drives a SandboxWarmPool through its scale subresource: an HPA of
// the chart's shape (templates/autoscaling.yaml) on a pool of the test's own reports
// AbleToScale=True (SucceededGetScale: it read the pool's scale, replicas and selector). Whether
// it can also act depends on an External metrics adapter behind the aggregation layer; the test
// logs the HPA's ScalingActive condition, which names what is missing when it cannot
// (docs/metrics.md, "Autoscaling a pool").
func TestHPAReadsThePoolScale(t *testing.T) {
	c := clustertest.Connect(t)
	const testPool = "e2e-hpa"
	benchPool(t, c, testPool, 1)
	kc, err := kubernetes.NewForConfig(clustertest.RESTConfig(t, c.AdminKubeconfig()))
	if err != nil {
		t.Fatal(err)
	}
	hpas := kc.AutoscalingV2().HorizontalPodAutoscalers(namespace)
	hpa := &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Name: testPool},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "extensions.agents.x-k8s.io/v1beta1", Kind: "SandboxWarmPool", Name: testPool},
			MinReplicas:    ptr.To[int32](1),
			MaxReplicas:    4,
			Metrics: []autoscalingv2.MetricSpec{{
				Type: autoscalingv2.ExternalMetricSourceType,
				External: &autoscalingv2.ExternalMetricSource{
					Metric: autoscalingv2.MetricIdentifier{Name: "sandbox_executor_pool_claims", Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": testPool}}},
					Target: autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: ptr.To(resource.MustParse("1"))},
				},
			}},
			Behavior: &autoscalingv2.HorizontalPodAutoscalerBehavior{ScaleDown: &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: ptr.To[int32](10)}},
		},
	}
	_ = hpas.Delete(context.Background(), testPool, metav1.DeleteOptions{})
	created, err := hpas.Create(context.Background(), hpa, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hpas.Delete(context.Background(), testPool, metav1.DeleteOptions{}) })

	// The HPA controller syncs every 15 s: wait for its verdict on the pool's scale.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	selector := fields.OneTermEqualSelector("metadata.name", testPool).String()
	lw := &cache.ListWatch{WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		o.FieldSelector = selector
		return hpas.Watch(ctx, o)
	}}
	ev, err := watchtools.Until(ctx, created.ResourceVersion, lw, func(e watch.Event) (bool, error) {
		h, ok := e.Object.(*autoscalingv2.HorizontalPodAutoscaler)
		return ok && hpaCondition(h, autoscalingv2.AbleToScale) != nil && hpaCondition(h, autoscalingv2.ScalingActive) != nil, nil
	})
	if err != nil {
		t.Fatalf("the HPA controller gave HPA %s no AbleToScale and ScalingActive conditions within 2 minutes: %v", testPool, err)
	}
	got := ev.Object.(*autoscalingv2.HorizontalPodAutoscaler)
	able := hpaCondition(got, autoscalingv2.AbleToScale)
	if able.Status != "True" || able.Reason != "SucceededGetScale" {
		t.Errorf("AbleToScale %s (%s: %s), want True (SucceededGetScale): the HPA cannot drive the pool's scale subresource", able.Status, able.Reason, able.Message)
	}
	active := hpaCondition(got, autoscalingv2.ScalingActive)
	t.Logf("HPA %s: AbleToScale %s (%s); ScalingActive %s (%s: %s)", testPool, able.Status, able.Reason, active.Status, active.Reason, active.Message)
}
