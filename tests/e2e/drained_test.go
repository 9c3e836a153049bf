//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
)

// drainedPool is an empty warm pool on the local template, and a config that maps the CI image to it.
func drainedPool(t *testing.T, name, policy string) *clusterjobs.Runner {
	t.Helper()
	c := clusterjobs.Connect(t)
	benchPool(t, c, name, 0)
	return newRunner(t, c, localcluster.Config{Pools: localcluster.Pools(name), Extra: `drained_pool = "` + policy + `"`})
}

// A drained pool (of no replicas) with drained_pool = "cold": the claim gets a sandbox created for
// it, and the job log says so from the outcome, with no prediction before the claim.
func TestDrainedPoolColdStart(t *testing.T) {
	t.Parallel()
	j := newJob(t, drainedPool(t, "e2e-drained-cold", "cold"), ciImage)
	out, err := j.Command("prepare").CombinedOutput()
	t.Cleanup(func() { j.Command("cleanup").Run() })
	if err != nil {
		t.Fatalf("prepare: %v\n%s", err, out)
	}
	mustContain(t, "prepare log", string(out), "Sandbox ready: pool e2e-drained-cold (cold start: the pool had no sandbox to hand out)")
	if strings.Contains(string(out), "is drained") {
		t.Errorf("prepare predicts from the pool's state before the claim:\n%s", out)
	}
}

// A drained pool with drained_pool = "wait": prepare claims nothing until the pool has a ready
// sandbox, then gets it, and says how long it waited.
func TestDrainedPoolWaitsForAWarmSandbox(t *testing.T) {
	t.Parallel()
	const pool = "e2e-drained-wait"
	c := drainedPool(t, pool, "wait")
	j := newJob(t, c, ciImage)
	out := clusterjobs.NewLive()
	prepare := j.Command("prepare")
	prepare.Stdout, prepare.Stderr = out, out
	if err := prepare.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Command("cleanup").Run() })
	if !out.Wait("waiting for a warm sandbox", time.Minute) {
		t.Fatalf("prepare does not say it waits:\n%s", out.String())
	}
	claims, err := c.Admin.Extensions.ExtensionsV1beta1().SandboxClaims(namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range claims.Items {
		if cl.Spec.WarmPoolRef.Name == pool {
			t.Errorf("claim %s made while the pool is drained: it would cold-start", cl.Name)
		}
	}
	if _, err := c.Admin.Extensions.ExtensionsV1beta1().SandboxWarmPools(namespace).Patch(context.Background(), pool,
		types.MergePatchType, []byte(`{"spec":{"replicas":1}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := prepare.Wait(); err != nil {
		t.Fatalf("prepare: %v\n%s", err, out.String())
	}
	mustContain(t, "prepare log", out.String(), "Sandbox ready: pool "+pool+" (waited ", " ms for a warm sandbox)")
}
