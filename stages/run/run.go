// Package run implements run_exec: it runs one stage script in the job's pod and reports its
// outcome the way the runner expects.
package run

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/gitlab"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/stages"
)

// killGrace is how long a cancelled stage gets between SIGTERM and SIGKILL.
const killGrace = 5 * time.Second

// Run executes the script at scriptPath (on the runner host) as stage stageName in the pod.
// The script travels over exec stdin only.
func Run(ctx context.Context, env *stages.Env, scriptPath, stageName string) error {
	script, err := os.ReadFile(scriptPath)
	if err != nil {
		return failure.SystemError(nil, "reading stage script %s: %v", scriptPath, errors.Unwrap(err))
	}
	job, err := env.Job()
	if err != nil {
		return err
	}
	cluster, err := env.Cluster()
	if err != nil {
		return err
	}
	name := env.ClaimName(job)
	state, err := executor.LoadJob(ctx, env.Runner.TmpDir, name, func(ctx context.Context) (*kube.Sandbox, error) {
		return cluster.Find(ctx, env.Config.Namespace, name, env.Binding(job), env.Config.RuntimeClasses)
	})
	if err != nil {
		return err
	}
	sbx := state.Sandbox
	ca, err := env.AgentCA()
	if err != nil {
		return err
	}
	agent, err := state.Transport.Executor(sbx, cluster.Exec(), ca, env.Binding(job))
	if err != nil {
		return err
	}
	runner := &executor.StageRunner{
		Exec:       agent,
		Sandbox:    sbx,
		PodGone:    func(ctx context.Context) (string, error) { return cluster.PodGone(ctx, sbx) },
		Log:        env.Log(),
		Reconnects: env.Config.Reconnects,
		Backoff:    kube.RetryBackoff(),
		KillGrace:  killGrace,
	}
	stdout := env.Stdout
	var nono *gitlab.NonoWatch
	if gitlab.WrapsNono(script) {
		nono = &gitlab.NonoWatch{W: stdout}
		stdout = nono
	}
	started := env.Clock.Now()
	code, err := runner.Run(ctx, stageName, script, stdout, env.Stderr)
	reportBlocked(ctx, env, env.Log(), env.Config.Pool(sbx.Pool), sbx.PodIP, started)
	if err != nil {
		why := err
		if ctx.Err() != nil {
			// The runner's SIGTERM: a cancel, or the job's timeout by its deadline.
			why = state.StopCause(env.Clock.Now())
		}
		recordFailure(env, state, stageName, why)
		return err
	}
	if code != 0 {
		state.RecordFailure(stageName, failure.BuildError(code))
		if nono != nil && nono.Refused() != "" {
			env.Log().Errorf("%s", gitlab.NonoRefusal(nono.Refused(), sbx.RuntimeClass, sbx.Pool, stages.FencedBy(env.Config.Pool(sbx.Pool))))
		}
	}
	accountOverhead(env, state, stageName, env.Elapsed(started), runner.ScriptTime)
	if code != 0 {
		if err := env.Runner.WriteBuildExitCode(code); err != nil {
			return err
		}
		return failure.BuildError(code)
	}
	return nil
}

// recordFailure keeps a stage's failure in the job's state, for cleanup to record as the job's
// outcome. Like accountOverhead it is bookkeeping: a state it cannot write costs the outcome
// metric one job, never the stage its error.
func recordFailure(env *stages.Env, state *executor.JobState, stageName string, err error) {
	if env.Runner.TmpDir == "" || state.Overhead.Prepare == 0 {
		return // no state from prepare (older runners): nothing to keep it in
	}
	state.RecordFailure(stageName, err)
	if err := executor.SaveJob(env.Runner.TmpDir, state); err != nil {
		env.Log().Debugf("job state not saved after stage %s failed, its outcome will not be recorded: %v", stageName, err)
	}
}

// accountOverhead adds this stage's own cost to the job's state, and closes the job log with the
// executor's summary after the job's last stage. It is bookkeeping: a state file it cannot write
// costs the summary its accuracy, never the stage its outcome.
func accountOverhead(env *stages.Env, state *executor.JobState, stageName string, wall, script time.Duration) {
	if env.Runner.TmpDir == "" || state.Overhead.Prepare == 0 {
		return // no state from prepare (older runners): nothing to add up
	}
	state.Overhead.AddStage(wall, script)
	if err := executor.SaveJob(env.Runner.TmpDir, state); err != nil {
		env.Log().Debugf("job state not saved after stage %s, the summary will miss its cost: %v", stageName, err)
	}
	if gitlab.FinalStage(stageName, env.Runner.JobResponseFile != "") {
		env.Log().Infof("%s", state.Overhead.Summary(state.Sandbox))
	}
}
