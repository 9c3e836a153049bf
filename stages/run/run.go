// Package run implements run_exec: it runs one stage script in the job's pod and reports its
// outcome the way the runner expects.
package run

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/stages"
)

// killGrace is how long a cancelled stage gets between SIGTERM and SIGKILL.
const killGrace = 5 * time.Second

// Run executes the script at scriptPath (on the runner host) as stage stageName in the pod.
// The script travels over exec stdin only.
func Run(ctx context.Context, env *stages.Env, scriptPath, stageName string) error {
	script, err := os.ReadFile(scriptPath)
	if err != nil {
		return executor.SystemError(nil, "reading stage script %s: %v", scriptPath, errors.Unwrap(err))
	}
	job, err := env.Job()
	if err != nil {
		return err
	}
	claimer, err := env.Claimer()
	if err != nil {
		return err
	}
	sbx, err := claimer.LoadSandbox(ctx, env.Runner.TmpDir, env.Config.Namespace, env.ClaimName(job), env.Config.RuntimeClasses)
	if err != nil {
		return err
	}
	transport := claimer.Clients.Exec
	if sbx.AgentToken != "" && sbx.PodIP != "" {
		transport = executor.NewAgentNetwork(sbx.PodIP, sbx.AgentToken, claimer.Clients.Exec)
	}
	runner := &executor.StageRunner{
		Exec:       transport,
		Sandbox:    sbx,
		PodGone:    func(ctx context.Context) (string, error) { return claimer.PodGone(ctx, sbx) },
		Log:        env.Log(),
		Reconnects: env.Config.Reconnects,
		Backoff:    executor.DefaultBackoff,
		KillGrace:  killGrace,
	}
	started := env.Clock()
	code, err := runner.Run(ctx, stageName, script, env.Stdout, env.Stderr)
	reportBlocked(ctx, env.Log(), env.Config.Pool(sbx.Pool), sbx.PodIP, started)
	if err != nil {
		return err
	}
	accountOverhead(env, sbx, stageName, env.Elapsed(started), runner.ScriptTime)
	if code != 0 {
		if err := env.Runner.WriteBuildExitCode(code); err != nil {
			return err
		}
		return executor.BuildError(code)
	}
	return nil
}

// accountOverhead adds this stage's own cost to the job's state, and closes the job log with the
// executor's summary after the job's last stage. It is bookkeeping: a state file it cannot write
// costs the summary its accuracy, never the stage its outcome.
func accountOverhead(env *stages.Env, sbx *executor.Sandbox, stageName string, wall, script time.Duration) {
	if env.Runner.TmpDir == "" || sbx.Overhead.Prepare == 0 {
		return // no state from prepare (older runners): nothing to add up
	}
	sbx.Overhead.AddStage(wall, script)
	if err := executor.SaveSandbox(env.Runner.TmpDir, sbx); err != nil {
		env.Log().Debugf("job state not saved after stage %s, the summary will miss its cost: %v", stageName, err)
	}
	if executor.FinalStage(stageName, env.Runner.JobResponseFile != "") {
		env.Log().Infof("%s", sbx.Overhead.Summary(sbx))
	}
}
