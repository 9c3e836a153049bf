package exporter

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/poolmetrics"
)

// Names of every metric the exporter serves. The alert rules, the dashboard and the HPA
// manifests name them too; a unit test holds those to this list. The pool gauges are package
// poolmetrics's, which the metrics adapter serves too.
var (
	MetricPoolDesired        = poolmetrics.Desired.Name
	MetricPoolReady          = poolmetrics.Ready.Name
	MetricPoolWarming        = poolmetrics.Warming.Name
	MetricPoolClaims         = poolmetrics.Claims.Name
	MetricClaimsPastShutdown = poolmetrics.ClaimsPastShutdown.Name
	MetricFenceHeldOut       = poolmetrics.FenceHeldOut.Name
)

const (
	MetricStarts     = "sandbox_executor_starts_total"
	MetricClaimReady = "sandbox_executor_claim_ready_seconds"
	MetricJobs       = "sandbox_executor_jobs_total"
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

// poolDescs are the pool gauges' descriptions, by name.
var poolDescs = func() map[string]*prometheus.Desc {
	descs := map[string]*prometheus.Desc{}
	for _, g := range poolmetrics.Gauges {
		descs[g.Name] = prometheus.NewDesc(g.Name, g.Help, g.Labels, nil)
	}
	return descs
}()

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, g := range poolmetrics.Gauges {
		ch <- poolDescs[g.Name]
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	pools, err := c.snapshot()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(poolDescs[poolmetrics.Ready.Name], err)
		return
	}
	for _, s := range poolmetrics.Samples(pools) {
		ch <- prometheus.MustNewConstMetric(poolDescs[s.Gauge.Name], prometheus.GaugeValue, float64(s.Value), s.LabelValues...)
	}
}
