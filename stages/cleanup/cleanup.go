// Package cleanup implements cleanup_exec: it releases the job's claim (or deletes its
// cold-started Sandbox), which deletes its sandbox and pod. It is idempotent and bounded in time.
package cleanup

import (
	"context"
	"errors"

	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/egress"
	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/failure"
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
	revokeEgress(ctx, env, saved)
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

// revokeEgress withdraws the job's egress grant from the pool's egress proxy once the pod is
// gone, so that a pod that gets the address next cannot use it. A proxy that does not answer
// costs a warning: the grant lapses at the job's deadline anyway.
func revokeEgress(ctx context.Context, env *stages.Env, saved *kube.Sandbox) {
	if saved == nil || saved.PodIP == "" {
		return
	}
	pool := env.Config.Pool(saved.Pool)
	if pool == nil || !pool.GrantsEgress() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, egress.AdminTimeout)
	defer cancel()
	if err := egress.DeleteGrant(ctx, egress.AdminClient, pool.EgressProxy, saved.PodIP); err != nil {
		env.Log().Warnf("egress proxy %s: cannot withdraw the egress grant of pod %s (%s): %v; it lapses when the job's time is up", pool.EgressProxy, saved.Pod, saved.PodIP, err)
		return
	}
	env.Log().Debugf("Withdrew the egress grant of pod %s (%s)", saved.Pod, saved.PodIP)
}
