//go:build e2e

package e2e

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandbox-executor/sandbox-executor/tests/clustertest"
	"github.com/sandbox-executor/sandbox-executor/tests/localcluster"
)

// drainedPool is an empty warm pool on the local template, and a config that maps the CI image to it.
func drainedPool(t *testing.T, name, policy string) *clustertest.Runner {
	t.Helper()
	c := clustertest.Connect(t)
	benchPool(t, c, name, 0)
	return newRunner(t, c, localcluster.Config{Pools: localcluster.Pools(name), Extra: `drained_pool = "` + policy + `"`})
}

// A drained pool with drained_pool = "cold": the job says so and gets a cold-started sandbox.
func TestDrainedPoolColdStart(t *testing.T) {
	j := newJob(t, drainedPool(t, "e2e-drained-cold", "cold"), ciImage)
	out, err := j.Command("prepare").CombinedOutput()
	t.Cleanup(func() { j.Command("cleanup").Run() })
	if err != nil {
		t.Fatalf("prepare: %v\n%s", err, out)
	}
	mustContain(t, "prepare log", string(out), "e2e-drained-cold is drained (0 of 0 ready): this job gets a cold start", "(cold start)")
}

// A drained pool with drained_pool = "wait": prepare claims nothing until the pool has a ready
// sandbox, then gets it warm.
func TestDrainedPoolWaitsForAWarmSandbox(t *testing.T) {
	const pool = "e2e-drained-wait"
	c := drainedPool(t, pool, "wait")
	j := newJob(t, c, ciImage)
	out := clustertest.NewLive()
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
	mustContain(t, "prepare log", out.String(), "has a ready sandbox after", "(warm start)")
}
