//go:build e2e

package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandbox-executor/sandbox-executor/internal/testutil"
	"github.com/sandbox-executor/sandbox-executor/tests/fakegitlab"
)

// drainedPool is an empty warm pool on the local template, and a config that maps the CI image to it.
func drainedPool(t *testing.T, c *cluster, name, policy string) (configPath string) {
	t.Helper()
	benchPool(t, c, name, 0)
	configPath = filepath.Join(t.TempDir(), "config.toml")
	if err := c.WriteConfigWithPool(configPath, c.runnerName, name, `drained_pool = "`+policy+`"`); err != nil {
		t.Fatal(err)
	}
	return configPath
}

// A drained pool with drained_pool = "cold": the job says so and gets a cold-started sandbox.
func TestDrainedPoolColdStart(t *testing.T) {
	c := newCluster(t)
	configPath := drainedPool(t, c, "e2e-drained-cold", "cold")
	env := newStageEnv(t, fakegitlab.NextJobID(), ciImage)
	prepare := exec.Command(c.Binary(), "--config", configPath, "prepare")
	prepare.Env = env.vars
	out, err := prepare.CombinedOutput()
	t.Cleanup(func() { stageWithConfig(c, env, configPath, "cleanup").Run() })
	if err != nil {
		t.Fatalf("prepare: %v\n%s", err, out)
	}
	mustContain(t, "prepare log", string(out), "e2e-drained-cold is drained (0 of 0 ready): this job gets a cold start", "(cold start)")
}

// A drained pool with drained_pool = "wait": prepare claims nothing until the pool has a ready
// sandbox, then gets it warm.
func TestDrainedPoolWaitsForAWarmSandbox(t *testing.T) {
	c := newCluster(t)
	const pool = "e2e-drained-wait"
	configPath := drainedPool(t, c, pool, "wait")
	env := newStageEnv(t, fakegitlab.NextJobID(), ciImage)
	var out testutil.LockedBuffer
	prepare := stageWithConfig(c, env, configPath, "prepare")
	prepare.Stdout, prepare.Stderr = &out, &out
	if err := prepare.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stageWithConfig(c, env, configPath, "cleanup").Run() })
	for deadline := time.Now().Add(time.Minute); !strings.Contains(out.String(), "waiting for a warm sandbox"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("prepare does not say it waits:\n%s", out.String())
		}
	}
	claims, err := c.admin.Extensions.ExtensionsV1beta1().SandboxClaims(namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range claims.Items {
		if cl.Spec.WarmPoolRef.Name == pool {
			t.Errorf("claim %s made while the pool is drained: it would cold-start", cl.Name)
		}
	}
	if _, err := c.admin.Extensions.ExtensionsV1beta1().SandboxWarmPools(namespace).Patch(context.Background(), pool,
		types.MergePatchType, []byte(`{"spec":{"replicas":1}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := prepare.Wait(); err != nil {
		t.Fatalf("prepare: %v\n%s", err, out.String())
	}
	mustContain(t, "prepare log", out.String(), "has a ready sandbox after", "(warm start)")
}

func stageWithConfig(c *cluster, env *stageEnv, configPath string, args ...string) *exec.Cmd {
	cmd := exec.Command(c.Binary(), append([]string{"--config", configPath}, args...)...)
	cmd.Env = env.vars
	return cmd
}
