//go:build e2e && e2elong

package e2e

import (
	"bytes"
	"testing"
	"time"
)

// TestSilentStageForTenMinutes: a stage that prints nothing for 10 minutes must not die of an
// idle timeout anywhere between the executor and the pod. Runs in `make e2e-long` only.
func TestSilentStageForTenMinutes(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	j, _, _ := preparedJob(t, c, ciImage)
	var stdout, stderr bytes.Buffer
	run := j.Command("run", j.Script(t, "echo before\nsleep 600\necho after\n"), "build_script")
	run.Stdout, run.Stderr = &stdout, &stderr
	start := time.Now()
	if err := run.Run(); err != nil {
		t.Fatalf("silent stage failed after %s: %v\n%s", time.Since(start), err, stderr.String())
	}
	if stdout.String() != "before\nafter\n" {
		t.Errorf("output = %q", stdout.String())
	}
	t.Logf("silent for %s; reconnect notes: %q", time.Since(start).Round(time.Second), stderr.String())
}
