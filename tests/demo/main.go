// Command demo runs a Duo-shaped job (GitLab Duo Agent Platform flow) through the real
// gitlab-runner and sandbox-executor on the local cluster, against a fake GitLab API on
// loopback, and prints the job log as GitLab would show it. `make demo` runs it.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sandbox-executor/sandbox-executor/tests/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/localcluster"
	"github.com/sandbox-executor/sandbox-executor/tests/runner"
)

// duoScript is the shape of a flow job's script: setup, the duo CLI (a stand-in here: the
// package is not reachable from this machine), and an agent step that changes the project.
var duoScript = []string{
	"mkdir -p /opt/.gitlab-sandbox",
	`echo "setup_script: node $(node --version), npm $(npm --version), $(git --version)"`,
	`command -v duo || echo "duo CLI not in the image: a real flow runs npm install -g @gitlab/duo-cli here"`,
	`echo "kernel: $(uname -sr)"; dmesg | head -n 1`,
	`mkdir -p /tmp/project && cd /tmp/project && git init -q && echo "# goal: $DUO_WORKFLOW_GOAL" > GOAL.md`,
	`git add GOAL.md && git -c user.name="Duo Agent" -c user.email=duo@example.com commit -qm "Duo: $DUO_WORKFLOW_GOAL" && git log --oneline`,
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run() error {
	env, err := localcluster.Find()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "sandbox-executor-demo")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	configPath := filepath.Join(dir, "config.toml")
	if err := env.WriteConfig(configPath, "demo-runner", ""); err != nil {
		return err
	}
	gitlab := fakegitlab.New(fakegitlab.WithLongPolling(2 * time.Second))
	defer gitlab.Close()
	secret := func(k, v string) fakegitlab.Variable { return fakegitlab.Variable{Key: k, Value: v, Masked: true} }
	plain := func(k, v string) fakegitlab.Variable { return fakegitlab.Variable{Key: k, Value: v, Public: true} }
	job := gitlab.NewJob(fakegitlab.JobSpec{
		Name:        "duo-workflow",
		Image:       localcluster.CIImage,
		GitStrategy: "none",
		Tags:        []string{"gitlab--duo"},
		Script:      duoScript,
		Variables: []fakegitlab.Variable{
			plain("DUO_WORKFLOW_GOAL", "Add a GOAL.md to the project"),
			plain("DUO_WORKFLOW_DEFINITION", "software_development"),
			plain("DUO_WORKFLOW_PROJECT_ID", "1"),
			secret("DUO_WORKFLOW_SERVICE_TOKEN", "duo-demo-service-token-123456"),
			secret("DUO_WORKFLOW_GIT_HTTP_PASSWORD", "duo-demo-git-password-654321"),
			secret("GITLAB_TOKEN", "glpat-demo-token-abcdef"),
		},
	})
	gitlab.Enqueue(job)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	proc, err := runner.Start(runner.Options{URL: gitlab.URL(), Token: gitlab.RunnerToken(), Executor: env.CustomExecutor(configPath), Timeout: 5 * time.Minute})
	if err != nil {
		return err
	}
	defer proc.Stop()
	res, err := gitlab.Wait(ctx, job.ID)
	if err != nil {
		return fmt.Errorf("%w; runner log:\n%s", err, proc.Log())
	}
	fmt.Println(res.Trace)
	fmt.Printf("\n== job %d: %s in %s (handed out -> final state), through gitlab-runner %s and sandbox-executor\n",
		job.ID, res.State, res.Duration().Round(time.Millisecond), res.Runner.Version)
	if res.State != "success" {
		return fmt.Errorf("job %s (%s)", res.State, res.FailureReason)
	}
	return nil
}
