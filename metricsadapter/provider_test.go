package metricsadapter_test

import (
	"context"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/provider"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/metricsadapter"
	"github.com/sandbox-executor/sandbox-executor/poolmetrics"
)

const ns = "sandbox-executor"

var now = time.Date(2026, 11, 24, 7, 0, 0, 0, time.UTC)

func newProvider(pools []kube.PoolState, err error) *metricsadapter.Provider {
	return metricsadapter.NewProvider(ns, func() ([]kube.PoolState, error) { return pools, err }, clocktesting.NewFakePassiveClock(now))
}

var twoPools = []kube.PoolState{
	{Name: "duo-default", Desired: 3, Ready: 1, Total: 2, ClaimsWaiting: 2, ClaimsReady: 1},
	{Name: "duo-posix", Desired: 1, Ready: 1, Total: 1},
}

// series is a list's values by their labels, as "k=v,k=v".
func series(t *testing.T, p *metricsadapter.Provider, metric, selector string) map[string]int64 {
	t.Helper()
	sel, err := labels.Parse(selector)
	if err != nil {
		t.Fatal(err)
	}
	list, err := p.GetExternalMetric(context.Background(), ns, sel, provider.ExternalMetricInfo{Metric: metric})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, v := range list.Items {
		if v.MetricName != metric || !v.Timestamp.Time.Equal(now) {
			t.Errorf("series %+v: want metric %s at %v", v, metric, now)
		}
		out[labels.Set(v.MetricLabels).String()] = v.Value.Value()
	}
	return out
}

// The HPA's query of the chart's shape sums what the selector matches: a pool's claims, waiting
// and ready, both series present even at zero.
func TestClaimsOfAPool(t *testing.T) {
	p := newProvider(twoPools, nil)
	got := series(t, p, poolmetrics.Claims.Name, "pool=duo-default")
	want := map[string]int64{"pool=duo-default,state=waiting": 2, "pool=duo-default,state=ready": 1}
	if len(got) != len(want) || got["pool=duo-default,state=waiting"] != 2 || got["pool=duo-default,state=ready"] != 1 {
		t.Errorf("claims of duo-default: %v, want %v", got, want)
	}
	if got := series(t, p, poolmetrics.Claims.Name, "pool=duo-posix"); len(got) != 2 || got["pool=duo-posix,state=waiting"] != 0 || got["pool=duo-posix,state=ready"] != 0 {
		t.Errorf("claims of an idle pool: %v, want both states at 0", got)
	}
	if got := series(t, p, poolmetrics.Claims.Name, "pool=duo-default,state=waiting"); len(got) != 1 || got["pool=duo-default,state=waiting"] != 2 {
		t.Errorf("waiting claims of duo-default: %v", got)
	}
	if got := series(t, p, poolmetrics.Claims.Name, "pool=gone"); len(got) != 0 {
		t.Errorf("claims of a pool that does not exist: %v, want none", got)
	}
	if got := series(t, p, poolmetrics.Warming.Name, ""); got["pool=duo-default"] != 1 || got["pool=duo-posix"] != 0 || len(got) != 2 {
		t.Errorf("warming sandboxes of every pool: %v", got)
	}
}

// What cannot be answered is a NotFound that says why, which the HPA shows in its ScalingActive
// condition; a snapshot that fails is a server error.
func TestWhatItCannotAnswer(t *testing.T) {
	p := newProvider(twoPools, nil)
	_, err := p.GetExternalMetric(context.Background(), "other", labels.Everything(), provider.ExternalMetricInfo{Metric: poolmetrics.Claims.Name})
	if !apierrors.IsNotFound(err) || !strings.Contains(err.Error(), "serves the pools of namespace sandbox-executor, not other") {
		t.Errorf("another namespace: %v, want NotFound naming the namespace served", err)
	}
	_, err = p.GetExternalMetric(context.Background(), ns, labels.Everything(), provider.ExternalMetricInfo{Metric: "sandbox_executor_starts_total"})
	if !apierrors.IsNotFound(err) {
		t.Errorf("a metric that is not a pool gauge: %v, want NotFound", err)
	}
	_, err = newProvider(nil, errors.New("cache stopped")).GetExternalMetric(context.Background(), ns, labels.Everything(), provider.ExternalMetricInfo{Metric: poolmetrics.Claims.Name})
	if !apierrors.IsInternalError(err) || !strings.Contains(err.Error(), "cache stopped") {
		t.Errorf("a failed snapshot: %v, want an internal error with its cause", err)
	}
}

// Discovery lists every pool gauge, and nothing else.
func TestListsThePoolGauges(t *testing.T) {
	var got, want []string
	for _, m := range newProvider(nil, nil).ListAllExternalMetrics() {
		got = append(got, m.Metric)
	}
	for _, g := range poolmetrics.Gauges {
		want = append(want, g.Name)
	}
	if !slices.Equal(got, want) {
		t.Errorf("listed %v, want %v", got, want)
	}
}

// The executor the runner starts for every stage stays free of the API server library, which
// only the adapter's own binary links.
func TestExecutorDoesNotLinkTheAPIServer(t *testing.T) {
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	for cmd, wantAPIServer := range map[string]bool{"./cmd/sandbox-executor": false, "./cmd/sandbox-executor-metrics-adapter": true} {
		list := exec.Command("go", "list", "-deps", cmd)
		list.Dir = root
		out, err := list.Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", cmd, err)
		}
		if got := slices.Contains(strings.Fields(string(out)), "k8s.io/apiserver/pkg/server"); got != wantAPIServer {
			t.Errorf("%s links k8s.io/apiserver/pkg/server: %v, want %v", cmd, got, wantAPIServer)
		}
	}
}

// The command line refuses to start without the namespace it serves.
func TestNamespaceIsRequired(t *testing.T) {
	a := metricsadapter.New(pflagSet(), clocktesting.NewFakePassiveClock(now))
	if err := a.Run(context.Background(), nil); err == nil || !strings.Contains(err.Error(), "--namespace is required") {
		t.Errorf("Run without --namespace: %v", err)
	}
}

func pflagSet() *pflag.FlagSet { return pflag.NewFlagSet("test", pflag.ContinueOnError) }
