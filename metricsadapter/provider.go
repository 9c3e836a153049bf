// Package metricsadapter serves the warm pools' gauges (package poolmetrics) through the
// Kubernetes External metrics API, external.metrics.k8s.io/v1beta1, for the
// HorizontalPodAutoscaler that sizes a pool (docs/metrics.md, "Autoscaling a pool"). It is an
// extension API server behind the aggregation layer, built on sigs.k8s.io/custom-metrics-apiserver,
// in a binary of its own (cmd/sandbox-executor-metrics-adapter): the executor the runner starts
// for every stage must not carry k8s.io/apiserver.
package metricsadapter

import (
	"context"
	"fmt"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/metrics/pkg/apis/external_metrics"
	"k8s.io/utils/clock"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/provider"

	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/poolmetrics"
)

// Provider answers External metrics queries from a snapshot of one namespace's pools, taken at
// each query from the informers' caches (kube.Observer.Pools): no API call per query.
type Provider struct {
	namespace string
	pools     func() ([]kube.PoolState, error)
	clock     clock.PassiveClock
}

// NewProvider serves the pools of namespace that pools returns.
func NewProvider(namespace string, pools func() ([]kube.PoolState, error), clk clock.PassiveClock) *Provider {
	return &Provider{namespace: namespace, pools: pools, clock: clk}
}

var _ provider.ExternalMetricsProvider = (*Provider)(nil)

// GetExternalMetric returns the series of the metric whose labels match selector. An HPA asks
// in its own namespace: only the adapter's namespace has pools here, another gets NotFound
// naming the namespace served, which the HPA reports in its ScalingActive condition.
func (p *Provider) GetExternalMetric(_ context.Context, namespace string, selector labels.Selector, info provider.ExternalMetricInfo) (*external_metrics.ExternalMetricValueList, error) {
	if !served(info.Metric) {
		return nil, provider.NewMetricNotFoundError(schema.GroupResource{Group: external_metrics.GroupName}, info.Metric)
	}
	if namespace != p.namespace {
		return nil, &apierrors.StatusError{ErrStatus: metav1.Status{
			Status: metav1.StatusFailure, Code: http.StatusNotFound, Reason: metav1.StatusReasonNotFound,
			Message: fmt.Sprintf("metric %s: this adapter serves the pools of namespace %s, not %s", info.Metric, p.namespace, namespace),
		}}
	}
	pools, err := p.pools()
	if err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("reading the pools of namespace %s: %w", p.namespace, err))
	}
	now := metav1.NewTime(p.clock.Now())
	list := &external_metrics.ExternalMetricValueList{}
	for _, s := range poolmetrics.Samples(pools) {
		set := s.LabelSet()
		if s.Gauge.Name != info.Metric || !selector.Matches(labels.Set(set)) {
			continue
		}
		list.Items = append(list.Items, external_metrics.ExternalMetricValue{
			MetricName:   s.Gauge.Name,
			MetricLabels: set,
			Timestamp:    now,
			Value:        *resource.NewQuantity(int64(s.Value), resource.DecimalSI),
		})
	}
	return list, nil
}

// ListAllExternalMetrics lists the pool gauges (API discovery).
func (p *Provider) ListAllExternalMetrics() []provider.ExternalMetricInfo {
	out := make([]provider.ExternalMetricInfo, len(poolmetrics.Gauges))
	for i, g := range poolmetrics.Gauges {
		out[i] = provider.ExternalMetricInfo{Metric: g.Name}
	}
	return out
}

func served(metric string) bool {
	for _, g := range poolmetrics.Gauges {
		if g.Name == metric {
			return true
		}
	}
	return false
}
