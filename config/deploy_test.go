package config_test

import (
	"testing"

	"github.com/sandbox-executor/sandbox-executor/config"
)

// The config shipped in deploy/runner is valid, uses the pod's ServiceAccount (in-cluster config),
// and pins runner_name: the gc CronJob reaps claims by it, whichever runner pod made them.
func TestDeployRunnerConfig(t *testing.T) {
	cfg, err := config.Load("../deploy/runner/config.toml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Kubeconfig != "" || cfg.Context != "" {
		t.Errorf("kubeconfig %q, context %q: the runner pod must use its in-cluster ServiceAccount", cfg.Kubeconfig, cfg.Context)
	}
	if cfg.RunnerName != "duo-runner" {
		t.Errorf("runner_name %q: must be set explicitly, not the pod's host name", cfg.RunnerName)
	}
	if cfg.Namespace != "sandbox-executor" {
		t.Errorf("namespace %q: deploy/base installs the pools in sandbox-executor", cfg.Namespace)
	}
}
