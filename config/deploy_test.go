package config_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/helmchart"
)

// The config the chart gives gc is valid (the runner's is the same plus the runner image's
// binaries and the agent CA: tests/chart), uses the pod's ServiceAccount (in-cluster config), and pins
// runner_name: gc reaps claims by it, whichever runner pod made them.
func TestChartExecutorConfig(t *testing.T) {
	objs := helmchart.Render(t, "sandbox-executor", "ci-sandbox", "")
	var cm corev1.ConfigMap
	objs.Decode(t, "ConfigMap", "sandbox-executor-config", &cm)
	cfg, err := config.Parse("gc.toml", []byte(cm.Data["gc.toml"]))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Kubeconfig != "" || cfg.Context != "" {
		t.Errorf("kubeconfig %q, context %q: the runner pod must use its in-cluster ServiceAccount", cfg.Kubeconfig, cfg.Context)
	}
	if cfg.RunnerName != "duo-runner" {
		t.Errorf("runner_name %q: must be set explicitly, not the pod's host name", cfg.RunnerName)
	}
	if cfg.Namespace != "ci-sandbox" {
		t.Errorf("namespace %q: the chart installs the pools in the release's namespace, ci-sandbox", cfg.Namespace)
	}
	if cfg.StageTransport != config.TransportExec {
		t.Errorf("stage_transport %q: gc runs no stages and has no agent CA: want exec", cfg.StageTransport)
	}
}
