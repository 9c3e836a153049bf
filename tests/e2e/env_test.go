//go:build e2e

// Package e2e runs real jobs through sandbox-executor on the real local cluster (make
// cluster-up): kube-apiserver, the agent-sandbox controller, gVisor pods, and the real
// gitlab-runner against a fake GitLab API on loopback.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/tests/localcluster"
	"github.com/sandbox-executor/sandbox-executor/tests/runner"
)

const (
	namespace = localcluster.Namespace
	pool      = localcluster.Pool
	ciImage   = localcluster.CIImage
)

// cluster is the local cluster and our binaries, as the Makefile set them up.
type cluster struct {
	*localcluster.Env
	configPath string
	runnerName string
	// admin talks to the cluster with full rights, to check what the executor left behind.
	admin *executor.Clients
}

// newCluster checks the local cluster is up and writes an executor config for it.
func newCluster(t testing.TB) *cluster {
	t.Helper()
	env, err := localcluster.Find()
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{Env: env, configPath: filepath.Join(t.TempDir(), "config.toml"), runnerName: "e2e-" + strconv.Itoa(os.Getpid())}
	if err := env.WriteConfig(c.configPath, c.runnerName, ""); err != nil {
		t.Fatal(err)
	}
	adminCfg, err := config.Parse("admin", []byte(fmt.Sprintf("kubeconfig = %q\nnamespace = %q\n[[pool]]\nname = %q\n", env.AdminKubeconfig(), namespace, pool)))
	if err != nil {
		t.Fatal(err)
	}
	if c.admin, err = executor.NewClients(adminCfg); err != nil {
		t.Fatal(err)
	}
	return c
}

// customExecutor is the [runners.custom] section pointing at our binary.
func (c *cluster) customExecutor() runner.CustomExecutor { return c.CustomExecutor(c.configPath) }

// assertJobGone waits until no claim, sandbox or pod of the job is left.
func (c *cluster) assertJobGone(t testing.TB, jobID int64) {
	t.Helper()
	ctx := context.Background()
	selector := executor.LabelJobID + "=" + strconv.FormatInt(jobID, 10) + "," + executor.LabelRunner + "=" + executor.RunnerLabel(c.runnerName)
	var left string
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		left = ""
		claims, err := c.admin.Extensions.ExtensionsV1beta1().SandboxClaims(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			t.Fatal(err)
		}
		for _, cl := range claims.Items {
			left += " claim/" + cl.Name
		}
		// Sandboxes and pods carry the claim's UID; a released claim's are garbage-collected.
		sandboxes, err := c.admin.Sandboxes.AgentsV1beta1().Sandboxes(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range sandboxes.Items {
			for _, o := range s.OwnerReferences {
				if o.Kind == "SandboxClaim" && o.Name == executor.ClaimName(c.runnerName, jobID) {
					left += " sandbox/" + s.Name
				}
			}
		}
		if left == "" {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Errorf("job %d left behind after cleanup:%s", jobID, left)
}

// podExec runs a command in a pod with admin rights, to look at it from outside.
func (c *cluster) podExec(t testing.TB, pod string, command ...string) (string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer // one buffer each: the streams are copied concurrently
	err := c.admin.Exec.Exec(context.Background(), executor.ExecRequest{
		Namespace: namespace, Pod: pod, Container: "job", Command: command, Stdout: &stdout, Stderr: &stderr,
	})
	return stdout.String() + stderr.String(), err
}

// stageEnv is the environment a modern runner gives every stage.
type stageEnv struct {
	dir     string
	jobFile string
	vars    []string
}

func newStageEnv(t testing.TB, jobID int64, image string) *stageEnv {
	t.Helper()
	dir := t.TempDir()
	jobFile := filepath.Join(dir, "response.json")
	job := fmt.Sprintf(`{"id":%d,"token":"glcbt-e2e-secret-token","job_info":{"project_id":42},"runner_info":{"timeout":600},"image":{"name":%q},"variables":[{"key":"CI_PIPELINE_ID","value":"4242"}]}`, jobID, image)
	if err := os.WriteFile(jobFile, []byte(job), 0o600); err != nil {
		t.Fatal(err)
	}
	return &stageEnv{dir: dir, jobFile: jobFile, vars: append(os.Environ(),
		"TMPDIR="+dir, "JOB_RESPONSE_FILE="+jobFile, "BUILD_EXIT_CODE_FILE="+filepath.Join(dir, "exit-code"),
		"BUILD_FAILURE_EXIT_CODE=1", "SYSTEM_FAILURE_EXIT_CODE=2",
		"CUSTOM_ENV_CI_JOB_TOKEN=glcbt-e2e-secret-token", "CUSTOM_ENV_DUO_WORKFLOW_SERVICE_TOKEN=duo-e2e-secret")}
}

// stage runs one stage of our binary directly, as a runner would.
func (c *cluster) stage(env *stageEnv, args ...string) *exec.Cmd {
	return stageWithConfig(c, env, c.configPath, args...)
}

func (e *stageEnv) script(t testing.TB, name, body string) string {
	t.Helper()
	p := filepath.Join(e.dir, name)
	if err := os.WriteFile(p, []byte("trap 'exit 1' TERM\n"+body), 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

func mustContain(t testing.TB, what, text string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(text, w) {
			t.Errorf("%s lacks %q:\n%s", what, w, text)
		}
	}
}

func replaceInFile(t testing.TB, path, old, new string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), old) {
		t.Fatalf("%s does not contain %q", path, old)
	}
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(data), old, new)), 0o600); err != nil {
		t.Fatal(err)
	}
}
