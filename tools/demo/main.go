// Command demo runs a Duo-shaped job (GitLab Duo Agent Platform flow) through the real
// gitlab-runner and sandbox-executor on the local cluster, against a stand-in GitLab instance on
// the network job pods may reach (tools/duoflow), and prints the job log as GitLab would show it
// and the commit the job pushed. `make demo` runs it.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sandbox-executor/sandbox-executor/tests/localcluster"
	"github.com/sandbox-executor/sandbox-executor/tests/runner"
	"github.com/sandbox-executor/sandbox-executor/tools/duoflow"
)

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
	helper, err := duoflow.HelperConfig()
	if err != nil {
		return err
	}
	configPath := filepath.Join(dir, "config.toml")
	if err := env.WriteConfig(configPath, localcluster.Config{RunnerName: "demo-runner", Extra: helper}); err != nil {
		return err
	}
	inst, err := duoflow.NewInstance()
	if err != nil {
		return err
	}
	defer inst.Close()
	base, err := inst.CreateProject()
	if err != nil {
		return err
	}
	job := inst.Job(base, localcluster.CIImage)
	inst.GitLab.Enqueue(job)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	proc, err := runner.Start(runner.Options{URL: inst.GitLab.URL(), Token: inst.GitLab.RunnerToken(),
		Executor: env.CustomExecutor(configPath), Cache: inst.RunnerCache(), Timeout: 5 * time.Minute})
	if err != nil {
		return err
	}
	defer proc.Stop()
	res, err := inst.GitLab.Wait(ctx, job.ID)
	if err != nil {
		return fmt.Errorf("%w; runner log:\n%s", err, proc.Log())
	}
	// The runner has released the sandbox before it sent the final state; let it exit on its own.
	if _, err := proc.Wait(ctx); err != nil {
		return err
	}
	fmt.Println(res.Trace)
	fmt.Printf("\n== job %d: %s in %s (handed out -> final state), through gitlab-runner %s and sandbox-executor\n",
		job.ID, res.State, res.Duration().Round(time.Millisecond), res.Runner.Version)
	if res.State != "success" {
		return fmt.Errorf("job %s (%s)", res.State, res.FailureReason)
	}
	pushed, err := inst.Repos.RepoGit(duoflow.Project, "log", "-1", "--stat", "--format=%h %an: %s", duoflow.Branch(job.ID))
	if err != nil {
		return err
	}
	fmt.Printf("== pushed to %s on the instance:\n%s\n", duoflow.Branch(job.ID), pushed)
	return nil
}
