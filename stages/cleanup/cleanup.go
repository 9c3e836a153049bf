// Package cleanup implements cleanup_exec: it releases the job's claim, which deletes its
// sandbox and pod. It is idempotent and bounded in time.
package cleanup

import (
	"context"

	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/stages"
)

// Run deletes the job's claim. Its output goes to the runner's log, not the job log.
func Run(ctx context.Context, env *stages.Env) error {
	job, err := env.Job()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, env.Config.CleanupTimeout.Duration)
	defer cancel()
	claimer, err := env.Claimer()
	if err != nil {
		return err
	}
	name := env.ClaimName(job)
	if err := claimer.Release(ctx, env.Config.Namespace, name); err != nil {
		if ctx.Err() != nil {
			return executor.SystemError(nil, "releasing SandboxClaim %s/%s: no answer within cleanup_timeout %s; its shutdownTime will reap it", env.Config.Namespace, name, env.Config.CleanupTimeout.Duration)
		}
		return err
	}
	executor.ForgetSandbox(env.Runner.TmpDir)
	env.Log().Debugf("Released SandboxClaim %s/%s", env.Config.Namespace, name)
	return nil
}
