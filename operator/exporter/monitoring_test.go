package exporter_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/yaml"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/helmchart"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/operator/exporter"
)

// PromtoolEnv names the promtool binary; make unit sets it to the pinned promtool it installs.
const PromtoolEnv = "SANDBOX_EXECUTOR_PROMTOOL"

// exported is every metric name the exporter serves, with a histogram's series names, from a
// registry that has seen one pool, one start and one outcome.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := exporter.NewMetrics(reg, func() ([]kube.PoolState, error) { return []kube.PoolState{{Name: "p"}}, nil })
	m.Started(kube.JobStart{Pool: "p", Launch: kube.LaunchWarm})
	m.Ended(kube.JobEnd{Pool: "p", Outcome: kube.Outcome{Result: kube.OutcomeSuccess}})
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range families {
		names[f.GetName()] = true
		if f.GetType().String() == "HISTOGRAM" {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				names[f.GetName()+suffix] = true
			}
		}
	}
	return names
}

// monitoringFile is a file of the chart's monitoring set, or another the test names, by path from
// the module root.
func monitoringFile(t *testing.T, path string) string {
	t.Helper()
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

var metricName = regexp.MustCompile(`sandbox_executor_[a-z_]+`)

// Every metric the alerts, the dashboard and the autoscaling manifests name is one the exporter
// serves (a renamed metric would leave them silently empty), and the dashboard has a panel for
// each metric the exporter serves.
func TestMonitoringNamesOnlyExportedMetrics(t *testing.T) {
	served := exported(t)
	dashboard := monitoringFile(t, "deploy/chart/sandbox-executor/files/dashboard.json")
	for _, path := range []string{
		"deploy/chart/sandbox-executor/files/alerts.yaml",
		"deploy/chart/sandbox-executor/files/dashboard.json",
		"deploy/chart/sandbox-executor/templates/autoscaling.yaml",
		"tests/monitoring/alerts_test.yaml",
	} {
		for _, name := range metricName.FindAllString(monitoringFile(t, path), -1) {
			if !served[name] {
				t.Errorf("%s names %s, which the exporter does not serve", path, name)
			}
		}
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(dashboard), &dash); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	var inPanels []string
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q has no query", p.Title)
		}
		for _, target := range p.Targets {
			inPanels = append(inPanels, metricName.FindAllString(target.Expr, -1)...)
		}
	}
	for _, name := range []string{exporter.MetricPoolDesired, exporter.MetricPoolReady, exporter.MetricPoolWarming, exporter.MetricPoolClaims,
		exporter.MetricClaimsPastShutdown, exporter.MetricFenceHeldOut, exporter.MetricStarts, exporter.MetricClaimReady + "_bucket", exporter.MetricJobs} {
		if !served[name] {
			t.Errorf("the exporter does not serve %s", name)
		}
		if !slices.Contains(inPanels, name) {
			t.Errorf("no dashboard panel shows %s", name)
		}
	}
}

// The alert rules pass `promtool test rules`: each alert fires on what should fire it, after its
// "for", with its annotations filled in, and stays silent on the near misses.
func TestAlertRules(t *testing.T) {
	promtool := os.Getenv(PromtoolEnv)
	if promtool == "" {
		t.Fatalf("%s is not set: run `make unit` (it installs the pinned promtool), or point it at a promtool binary", PromtoolEnv)
	}
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	check, err := exec.Command(promtool, "check", "rules", filepath.Join(root, "deploy/chart/sandbox-executor/files/alerts.yaml")).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, check)
	}
	out, err := exec.Command(promtool, "test", "rules", filepath.Join(root, "tests/monitoring/alerts_test.yaml")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "SUCCESS") {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}

// The chart ships the tested rules and the checked dashboard as they are, and grants the
// exporter's ServiceAccount exactly kube.ObservePermissions.
func TestChartShipsTheMonitoring(t *testing.T) {
	objs := helmchart.Render(t, "sandbox-executor", "sandbox-executor",
		"exporter: {enabled: true, serviceMonitor: {enabled: true}, prometheusRule: {enabled: true}, dashboard: {enabled: true}}\n")
	const name = "sandbox-executor-exporter"
	rule := objs.Find("PrometheusRule", name)
	if rule == nil {
		t.Fatal("no PrometheusRule " + name)
	}
	var file map[string]any
	if err := yaml.Unmarshal([]byte(monitoringFile(t, "deploy/chart/sandbox-executor/files/alerts.yaml")), &file); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rule.Object["spec"], file) {
		t.Errorf("the PrometheusRule's spec is not files/alerts.yaml:\n%v", rule.Object["spec"])
	}
	dashboard := objs.Find("ConfigMap", name+"-dashboard")
	if dashboard == nil {
		t.Fatal("no dashboard ConfigMap")
	}
	data, _ := dashboard.Object["data"].(map[string]any)
	if strings.TrimSpace(data["sandbox-executor.json"].(string)) != strings.TrimSpace(monitoringFile(t, "deploy/chart/sandbox-executor/files/dashboard.json")) {
		t.Error("the dashboard ConfigMap is not files/dashboard.json")
	}
	for _, kind := range []string{"ServiceMonitor", "Service", "Deployment", "ServiceAccount", "RoleBinding"} {
		if objs.Find(kind, name) == nil {
			t.Errorf("no %s %s", kind, name)
		}
	}
	role := objs.Find("Role", name)
	if role == nil {
		t.Fatal("no Role " + name)
	}
	grants := helmchart.Grants(role)
	var want []string
	for _, p := range kube.ObservePermissions {
		want = append(want, p.String())
	}
	slices.Sort(want)
	if !slices.Equal(grants, want) {
		t.Errorf("Role %s grants %v, want exactly kube.ObservePermissions %v", name, grants, want)
	}
}
