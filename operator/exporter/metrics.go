package exporter

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandbox-executor/sandbox-executor/kube"
)

// Names of every metric the exporter serves. The alert rules, the dashboard and the HPA
// manifests name them too; a unit test holds those to this list.
const (
	MetricPoolDesired        = "sandbox_executor_pool_desired_sandboxes"
	MetricPoolReady          = "sandbox_executor_pool_ready_sandboxes"
	MetricPoolWarming        = "sandbox_executor_pool_warming_sandboxes"
	MetricPoolClaims         = "sandbox_executor_pool_claims"
	MetricClaimsPastShutdown = "sandbox_executor_claims_past_shutdown"
	MetricFenceHeldOut       = "sandbox_executor_pool_fence_held_out_pods"
	MetricStarts             = "sandbox_executor_starts_total"
	MetricClaimReady         = "sandbox_executor_claim_ready_seconds"
	MetricJobs               = "sandbox_executor_jobs_total"
)

// Metrics is every metric the exporter serves: the pools' state, read from the informers'
// caches at each scrape, and the jobs' starts and ends, counted as the informers see them.
type Metrics struct {
	starts     *prometheus.CounterVec
	claimReady *prometheus.HistogramVec
	jobs       *prometheus.CounterVec
	pools      *poolCollector
}

// NewMetrics registers the exporter's metrics on reg. pools is the snapshot the pool gauges
// read at each scrape.
func NewMetrics(reg prometheus.Registerer, pools func() ([]kube.PoolState, error)) *Metrics {
	m := &Metrics{
		starts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricStarts,
			Help: "Jobs whose sandbox turned Ready, by pool and launch: warm (Ready in the pool before the claim), waited (the claim waited for a booting pool sandbox), cold (created for the job). pool is empty for a cold_template start.",
		}, []string{"pool", "launch"}),
		claimReady: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: MetricClaimReady,
			Help: "Seconds from a claim's creation to its Ready condition, as the API records them (one-second resolution).",
			// Warm claims land in the first bucket; a sandbox boot takes seconds; past a few
			// minutes the job's prepare has given up.
			Buckets: []float64{0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120, 300},
		}, []string{"pool"}),
		jobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricJobs,
			Help: "Jobs whose outcome the executor recorded on their claim at cleanup, by pool, outcome (success, failed, canceled) and failure reason.",
		}, []string{"pool", "outcome", "reason"}),
		pools: &poolCollector{snapshot: pools},
	}
	reg.MustRegister(m.starts, m.claimReady, m.jobs, m.pools)
	return m
}

// Started counts a job's start.
func (m *Metrics) Started(s kube.JobStart) {
	m.starts.WithLabelValues(s.Pool, string(s.Launch)).Inc()
	if s.Pool != "" {
		m.claimReady.WithLabelValues(s.Pool).Observe(s.ClaimToReady.Seconds())
	}
}

// Ended counts a job's outcome.
func (m *Metrics) Ended(e kube.JobEnd) {
	m.jobs.WithLabelValues(e.Pool, e.Outcome.Result, e.Outcome.Reason).Inc()
}

// poolCollector reports the pools' gauges from a snapshot taken at scrape time, so that a pool
// that is deleted stops being reported.
type poolCollector struct {
	snapshot func() ([]kube.PoolState, error)
}

var (
	poolDesired = prometheus.NewDesc(MetricPoolDesired, "Sandboxes the pool is asked to keep (spec.replicas; the HPA's target when it scales the pool).", []string{"pool"}, nil)
	poolReady   = prometheus.NewDesc(MetricPoolReady, "Ready sandboxes waiting in the pool (status.readyReplicas).", []string{"pool"}, nil)
	poolWarming = prometheus.NewDesc(MetricPoolWarming, "Sandboxes in the pool still booting (status.replicas - status.readyReplicas).", []string{"pool"}, nil)
	poolClaims  = prometheus.NewDesc(MetricPoolClaims, "Claims on the pool: waiting (not Ready yet) or ready (running a job).", []string{"pool", "state"}, nil)
	pastDesc    = prometheus.NewDesc(MetricClaimsPastShutdown, "Claims on the pool whose shutdownTime has passed: leaked, the controller should have deleted them.", []string{"pool"}, nil)
	fenceDesc   = prometheus.NewDesc(MetricFenceHeldOut, "Pods of the pool that run but are held out of service because their egress fence check (the readiness probe) fails.", []string{"pool"}, nil)
)

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{poolDesired, poolReady, poolWarming, poolClaims, pastDesc, fenceDesc} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	pools, err := c.snapshot()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(poolReady, err)
		return
	}
	gauge := func(d *prometheus.Desc, v int, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	for _, p := range pools {
		gauge(poolDesired, int(p.Desired), p.Name)
		gauge(poolReady, int(p.Ready), p.Name)
		gauge(poolWarming, int(max(0, p.Total-p.Ready)), p.Name)
		gauge(poolClaims, p.ClaimsWaiting, p.Name, "waiting")
		gauge(poolClaims, p.ClaimsReady, p.Name, "ready")
		gauge(pastDesc, p.ClaimsPastShutdown, p.Name)
		gauge(fenceDesc, p.FenceHeldOut, p.Name)
	}
}
