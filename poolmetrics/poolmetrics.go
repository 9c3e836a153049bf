// Package poolmetrics names the warm pools' gauges and works out their values from a snapshot
// of the pools (kube.PoolState). Two servers read them: the exporter, as Prometheus metrics, and
// the metrics adapter, through the External metrics API the HorizontalPodAutoscaler asks
// (docs/metrics.md). One derivation for both, so that an HPA and a dashboard see the same
// numbers.
package poolmetrics

import (
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// Gauge is one pool gauge: its name, help text and label names.
type Gauge struct {
	Name   string
	Help   string
	Labels []string
}

// The pool gauges. Every one has the label pool; Claims also has state.
var (
	Desired = Gauge{"sandbox_executor_pool_desired_sandboxes",
		"Sandboxes the pool is asked to keep (spec.replicas; the HPA's target when it scales the pool).", []string{"pool"}}
	Ready = Gauge{"sandbox_executor_pool_ready_sandboxes",
		"Ready sandboxes waiting in the pool (status.readyReplicas).", []string{"pool"}}
	Warming = Gauge{"sandbox_executor_pool_warming_sandboxes",
		"Sandboxes in the pool still booting (status.replicas - status.readyReplicas).", []string{"pool"}}
	Claims = Gauge{"sandbox_executor_pool_claims",
		"Claims on the pool: waiting (not Ready yet) or ready (running a job).", []string{"pool", "state"}}
	ClaimsPastShutdown = Gauge{"sandbox_executor_claims_past_shutdown",
		"Claims on the pool whose shutdownTime has passed: leaked, the controller should have deleted them.", []string{"pool"}}
	FenceHeldOut = Gauge{"sandbox_executor_pool_fence_held_out_pods",
		"Pods of the pool that run but are held out of service because their egress fence check (the readiness probe) fails.", []string{"pool"}}
)

// Gauges lists every pool gauge.
var Gauges = []Gauge{Desired, Ready, Warming, Claims, ClaimsPastShutdown, FenceHeldOut}

// Sample is one series of a gauge: its label values, in the order of Gauge.Labels, and value.
type Sample struct {
	Gauge       Gauge
	LabelValues []string
	Value       int
}

// LabelSet is the sample's labels by name.
func (s Sample) LabelSet() map[string]string {
	set := make(map[string]string, len(s.Gauge.Labels))
	for i, name := range s.Gauge.Labels {
		set[name] = s.LabelValues[i]
	}
	return set
}

// Samples are every gauge's series for pools. Each pool has every series, zeros included, so
// that a pool without claims reads 0 rather than nothing.
func Samples(pools []kube.PoolState) []Sample {
	out := make([]Sample, 0, len(pools)*7)
	for _, p := range pools {
		add := func(g Gauge, v int, extra ...string) {
			out = append(out, Sample{Gauge: g, LabelValues: append([]string{p.Name}, extra...), Value: v})
		}
		add(Desired, int(p.Desired))
		add(Ready, int(p.Ready))
		add(Warming, int(max(0, p.Total-p.Ready)))
		add(Claims, p.ClaimsWaiting, "waiting")
		add(Claims, p.ClaimsReady, "ready")
		add(ClaimsPastShutdown, p.ClaimsPastShutdown)
		add(FenceHeldOut, p.FenceHeldOut)
	}
	return out
}
