//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/operator/exporter"
	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
)

// startExporter runs `sandbox-executor exporter` on the host with the admin configuration (the
// exporter's own RBAC is deploy/monitoring's, held to kube.ObservePermissions by a unit test)
// and returns the URL of its /metrics once it serves. The test stops it with SIGTERM and expects
// a clean exit.
func startExporter(t *testing.T, c *clusterjobs.Cluster) string {
	t.Helper()
	cmd := exec.Command(c.Binary(), "--config", c.AdminConfig, "exporter", "--listen", "127.0.0.1:0")
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
			t.Errorf("exporter after SIGTERM: %v\n%s", err, stderr.String())
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	url := regexp.MustCompile(`http://\S+/metrics`).FindString(line)
	if err != nil || url == "" {
		t.Fatalf("exporter did not start: %q %v\n%s", line, err, stderr.String())
	}
	return url
}

// metricFamilies is one scrape, parsed by Prometheus's own text parser.
type metricFamilies map[string]*dto.MetricFamily

func scrape(t *testing.T, url string) metricFamilies {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	return families
}

// value is the metric name's sample with exactly labels (counter, gauge, or a histogram's
// count), 0 when there is none.
func (m metricFamilies) value(name string, labels map[string]string) float64 {
	family := m[name]
	if family == nil {
		return 0
	}
	for _, metric := range family.Metric {
		if len(metric.Label) != len(labels) {
			continue
		}
		match := true
		for _, l := range metric.Label {
			match = match && labels[l.GetName()] == l.GetValue()
		}
		if !match {
			continue
		}
		switch {
		case metric.Counter != nil:
			return metric.Counter.GetValue()
		case metric.Gauge != nil:
			return metric.Gauge.GetValue()
		case metric.Histogram != nil:
			return float64(metric.Histogram.GetSampleCount())
		}
	}
	return 0
}

// waitScrape scrapes until done accepts a scrape, and returns it: the exporter follows the
// cluster through watches, which deliver what happened a moment after it happened.
func waitScrape(t *testing.T, url, what string, done func(metricFamilies) bool) metricFamilies {
	t.Helper()
	var last metricFamilies
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		last = scrape(t, url)
		return done(last), nil
	})
	if err != nil {
		t.Fatalf("exporter never showed %s; last scrape:\n%s", what, dump(last))
	}
	return last
}

func dump(m metricFamilies) string {
	var b strings.Builder
	for name, f := range m {
		if strings.HasPrefix(name, "sandbox_executor_") {
			for _, metric := range f.Metric {
				fmt.Fprintf(&b, "%s %v\n", name, metric)
			}
		}
	}
	return b.String()
}

// launchIn is how the job log says the job got its sandbox.
var launchIn = regexp.MustCompile(`Sandbox ready: pool \S+ \((warm start|waited|cold start)`)

// Jobs through the real gitlab-runner on a pool of the test's own, scraped by the exporter
// while they run: the pool's gauges equal the pool's status, every job's start is counted under
// the launch its job log names, the claim-to-Ready histogram has one sample per job, and the
// failed job is counted with its reason, the others as successes; a job on an empty pool of its
// own is counted as a cold start.
func TestExporterCountsWhatJobsDid(t *testing.T) {
	t.Parallel()
	c := clusterjobs.Connect(t)
	const testPool = "e2e-metrics"
	benchPool(t, c, testPool, 2)
	r := newRunner(t, c, localcluster.Config{Pools: localcluster.Pools(testPool)})
	url := startExporter(t, c)
	pool := map[string]string{"pool": testPool}

	// The pool as the API and the exporter see it, before any job.
	before := waitScrape(t, url, "the full pool", func(m metricFamilies) bool {
		return m.value(exporter.MetricPoolReady, pool) == 2
	})
	if got := before.value(exporter.MetricPoolDesired, pool); got != 2 {
		t.Errorf("%s = %v, want the pool's spec.replicas 2", exporter.MetricPoolDesired, got)
	}

	gitlab := fakegitlab.New()
	defer gitlab.Close()
	jobs := []struct {
		script []string
		state  string
	}{
		// Held until the test has scraped the exporter while it runs.
		{[]string{"echo held", "until [ -e /tmp/e2e-go-on ]; do sleep 0.2; done"}, fakegitlab.StateSuccess},
		{[]string{"echo two; exit 3"}, fakegitlab.StateFailed},
		{[]string{"echo three"}, fakegitlab.StateSuccess},
	}
	launches := map[string]float64{}
	for i, spec := range jobs {
		job := gitlab.NewJob(fakegitlab.JobSpec{Image: ciImage, GitStrategy: "none", Script: spec.script})
		gitlab.Enqueue(job)
		proc := startRunner(t, gitlab, r.Definition())
		if i == 0 {
			// While the job runs, its claim is on the pool, Ready.
			waitTrace(t, gitlab, proc, job.ID, "\nheld\n")
			waitScrape(t, url, "the running job's claim", func(m metricFamilies) bool {
				return m.value(exporter.MetricPoolClaims, map[string]string{"pool": testPool, "state": "ready"}) == 1
			})
			if out, err := c.Exec(context.Background(), jobPod(t, r, job), "touch", "/tmp/e2e-go-on"); err != nil {
				t.Fatalf("letting the job go on: %v %s", err, out)
			}
		}
		res := waitJob(t, gitlab, proc, job.ID)
		r.WaitJobGone(t, job.ID)
		if res.State != spec.state {
			t.Fatalf("job %d: %s, want %s\n%s", job.ID, res.State, spec.state, res.Trace)
		}
		how := launchIn.FindStringSubmatch(res.Trace)
		if how == nil {
			t.Fatalf("job %d: the job log does not say how it got its sandbox:\n%s", job.ID, res.Trace)
		}
		launch := map[string]string{"warm start": string(kube.LaunchWarm), "waited": string(kube.LaunchWaited), "cold start": string(kube.LaunchCold)}[how[1]]
		launches[launch]++
	}
	t.Logf("launches from the job logs: %v", launches)

	n := float64(len(jobs))
	outcome := func(result, reason string) map[string]string {
		return map[string]string{"pool": testPool, "outcome": result, "reason": reason}
	}
	after := waitScrape(t, url, "every job's start and outcome", func(m metricFamilies) bool {
		started := 0.0
		for _, l := range []kube.Launch{kube.LaunchWarm, kube.LaunchWaited, kube.LaunchCold} {
			started += m.value(exporter.MetricStarts, map[string]string{"pool": testPool, "launch": string(l)})
		}
		ended := m.value(exporter.MetricJobs, outcome(kube.OutcomeSuccess, "")) + m.value(exporter.MetricJobs, outcome(kube.OutcomeFailed, kube.ReasonScript))
		return started >= n && ended >= n
	})
	for _, l := range []kube.Launch{kube.LaunchWarm, kube.LaunchWaited, kube.LaunchCold} {
		if got := after.value(exporter.MetricStarts, map[string]string{"pool": testPool, "launch": string(l)}); got != launches[string(l)] {
			t.Errorf("%s{launch=%s} = %v, the job logs say %v\n%s", exporter.MetricStarts, l, got, launches[string(l)], dump(after))
		}
	}
	if got := after.value(exporter.MetricClaimReady, pool); got != n {
		t.Errorf("%s has %v samples, want one per job (%v)", exporter.MetricClaimReady, got, n)
	}
	if got := after.value(exporter.MetricJobs, outcome(kube.OutcomeSuccess, "")); got != 2 {
		t.Errorf("%s{outcome=success} = %v, want 2\n%s", exporter.MetricJobs, got, dump(after))
	}
	if got := after.value(exporter.MetricJobs, outcome(kube.OutcomeFailed, kube.ReasonScript)); got != 1 {
		t.Errorf("%s{outcome=failed,reason=script_failure} = %v, want 1\n%s", exporter.MetricJobs, got, dump(after))
	}
	// A cold start: a job on an empty pool with drained_pool = "cold" gets a sandbox created for
	// its claim, and is counted as cold on that pool.
	const coldPool = "e2e-metrics-cold"
	benchPool(t, c, coldPool, 0)
	cold := newRunner(t, c, localcluster.Config{Pools: localcluster.Pools(coldPool), Extra: `drained_pool = "cold"`})
	coldJob := gitlab.NewJob(fakegitlab.JobSpec{Image: ciImage, GitStrategy: "none", Script: []string{"echo cold"}})
	if res := runJob(t, cold, cold.Definition(), gitlab, coldJob); res.State != fakegitlab.StateSuccess || !strings.Contains(res.Trace, "(cold start") {
		t.Fatalf("job %d on the empty pool: %s, want success with a cold start\n%s", coldJob.ID, res.State, res.Trace)
	}
	coldLaunch := map[string]string{"pool": coldPool, "launch": string(kube.LaunchCold)}
	waitScrape(t, url, "the cold start", func(m metricFamilies) bool {
		return m.value(exporter.MetricStarts, coldLaunch) == 1 && m.value(exporter.MetricJobs, map[string]string{"pool": coldPool, "outcome": kube.OutcomeSuccess, "reason": ""}) == 1
	})

	for _, gauge := range []string{exporter.MetricClaimsPastShutdown, exporter.MetricFenceHeldOut} {
		if got := after.value(gauge, pool); got != 0 {
			t.Errorf("%s = %v, want 0: no claim leaked, every fence holds", gauge, got)
		}
	}

	// Once the pool has refilled, the ready gauge is the pool's status, as the API says it.
	waitPoolFull(t, c, testPool)
	p, err := c.Admin.Extensions.ExtensionsV1beta1().SandboxWarmPools(namespace).Get(context.Background(), testPool, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := float64(p.Status.ReadyReplicas)
	waitScrape(t, url, fmt.Sprintf("the refilled pool's readyReplicas %v", want), func(m metricFamilies) bool {
		return m.value(exporter.MetricPoolReady, pool) == want && m.value(exporter.MetricPoolWarming, pool) == float64(p.Status.Replicas-p.Status.ReadyReplicas)
	})
}
