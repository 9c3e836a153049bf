// Package cleanup implements cleanup_exec: it releases the job's claim (or deletes its
// cold-started Sandbox), which deletes its sandbox and pod. It is idempotent and bounded in time.
package cleanup

import (
	"context"
	"errors"
	"slices"

	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/gitlab"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/stages"
)

// Run deletes what the job owns. Its output goes to the runner's log, not the job log.
func Run(ctx context.Context, env *stages.Env) error {
	job, err := env.Job()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, env.Config.CleanupTimeout.Duration)
	defer cancel()
	cluster, err := env.Cluster()
	if err != nil {
		return err
	}
	return releaseJob(ctx, env, cluster, job)
}

// releaseJob releases what the job owns and withdraws its pod's egress grant, on every path
// once it knows the pod: a release that fails must not leave the grant live for the pod that
// gets the address next.
func releaseJob(ctx context.Context, env *stages.Env, cluster stages.Cluster, job *gitlab.Job) error {
	name := env.ClaimName(job)
	// Prepare's state says what the job owns. Without it (prepare failed half-way, or an old
	// runner without TMPDIR) a cold start may have made a Sandbox: delete both kinds. A state
	// file that cannot be read is reported, after releasing as if there were none.
	state, stateErr := executor.SavedJob(env.Runner.TmpDir, name)
	var saved *kube.Sandbox
	if state != nil {
		saved = state.Sandbox
	}
	releaseClaim := saved == nil || saved.ColdTemplate == ""
	releaseColdStart := saved != nil && saved.ColdTemplate != "" || saved == nil && env.Config.UnknownImage == config.UnknownImageCold
	binding := env.Binding(job)
	outcome := jobOutcome(state, env.Runner.TmpDir)
	// The grantee is looked up now, while its claim exists; withdrawn after the release.
	defer env.RevokeEgress(ctx, grantee(ctx, env, cluster, saved, name, binding))
	for _, release := range []struct {
		wanted bool
		kind   string
		delete func(ctx context.Context, namespace, name, binding string, outcome kube.Outcome) error
	}{
		{releaseClaim, "SandboxClaim", cluster.Release},
		{releaseColdStart, "Sandbox", cluster.ReleaseColdStart},
	} {
		if !release.wanted {
			continue
		}
		err := release.delete(ctx, env.Config.Namespace, name, binding, outcome)
		if errors.Is(err, kube.ErrOtherJob) {
			// Met by a job whose prepare was refused the other job's claim: that claim is not
			// this job's to release, and there is nothing of this job's to clean up.
			env.Log().Warnf("%s", err)
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return failure.SystemError(nil, "releasing %s %s/%s: no answer within cleanup_timeout %s; its shutdownTime will reap it", release.kind, env.Config.Namespace, name, env.Config.CleanupTimeout.Duration)
			}
			return err
		}
		env.Log().Debugf("Released %s %s/%s", release.kind, env.Config.Namespace, name)
	}
	executor.ForgetJob(env.Runner.TmpDir)
	return stateErr
}

// jobOutcome is the outcome cleanup records on the job's object: what the stages kept in the
// state (executor.JobState.Outcome); without a state, a runner that gives TMPDIR saw prepare
// fail before saving it; a runner without TMPDIR leaves the outcome unknown.
func jobOutcome(state *executor.JobState, tmpDir string) kube.Outcome {
	switch {
	case state != nil:
		return state.Outcome()
	case tmpDir != "":
		return kube.Outcome{Result: kube.OutcomeFailed, Reason: kube.ReasonPrepare}
	default:
		return kube.Outcome{}
	}
}

// grantee is the sandbox whose pod may hold the job's egress grant: prepare's saved one, or
// without a state (prepare failed after the grant, before saving it) the job's sandbox found
// by its claim, if a pool grants egress at all. Nil if it cannot be found: the grant, if any,
// lapses at the job's deadline.
func grantee(ctx context.Context, env *stages.Env, cluster stages.Cluster, saved *kube.Sandbox, name, binding string) *kube.Sandbox {
	if saved != nil || !slices.ContainsFunc(env.Config.Pools, func(p config.Pool) bool { return p.GrantsEgress() }) {
		return saved
	}
	sbx, err := cluster.Find(ctx, env.Config.Namespace, name, binding, env.Config.RuntimeClasses)
	if err != nil {
		env.Log().Debugf("No egress grant to withdraw found: %s", failure.Line(err))
		return nil
	}
	return sbx
}
