package prepare

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
	"github.com/sandbox-executor/sandbox-executor/egress/allowlist"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/gitlab"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/stages"
)

// grantEgress asks the pool's egress proxy to let the job's pod reach, for the job's lifetime
// (its claim's shutdownTime), the job's own GitLab instance (egress_instance, taken from the
// job JSON like SRT's allowlist, so no instance is configured anywhere) and the pool's
// egress_allow entries. The job log says what was granted. A grant that cannot be made
// releases the sandbox and fails prepare: the flow could not reach its instance. A grant the
// proxy may hold although the call failed (no answer) is withdrawn before that, since cleanup
// then finds no state to withdraw it from.
func grantEgress(ctx context.Context, env *stages.Env, cluster stages.Cluster, job *gitlab.Job, sbx *kube.Sandbox, binding string) error {
	pool := env.Config.Pool(sbx.Pool)
	if pool == nil || !pool.GrantsEgress() {
		return nil
	}
	grant := adminclient.Grant{Allow: pool.EgressAllow, Until: env.Clock.Now().Add(job.Timeout + env.Config.ClaimGrace.Duration)}
	if pool.EgressInstance {
		instance, err := allowlist.InstanceRules(job.ServerURL, job.ServerHost, pool.EgressInstanceWildcard)
		if err == nil && pool.EgressInstanceWildcard {
			err = job.CheckInstanceWildcard()
		}
		if err != nil {
			_, _ = releaseSandbox(ctx, cluster, sbx, binding, kube.Outcome{Result: kube.OutcomeFailed, Reason: kube.ReasonPermanent})
			return failure.PermanentError(nil, "pool %s grants each job its GitLab instance (egress_instance), but %v", pool.Name, err)
		}
		// The instance may be on-premises, at a private address: the proxy lets its names
		// resolve to one, and no other entry's.
		grant.Instance = instance
	}
	admin, err := env.EgressAdmin(pool)
	if err != nil {
		_, _ = releaseSandbox(ctx, cluster, sbx, binding, kube.Outcome{Result: kube.OutcomeFailed, Reason: kube.ReasonPermanent})
		return err
	}
	grantCtx, cancel := context.WithTimeout(ctx, adminclient.Timeout)
	defer cancel()
	if err := admin.PutGrant(grantCtx, sbx.PodIP, grant); err != nil {
		if refused := (*adminclient.RefusedError)(nil); !errors.As(err, &refused) {
			env.RevokeEgress(ctx, sbx)
		}
		released, relErr := releaseSandbox(ctx, cluster, sbx, binding, kube.Outcome{Result: kube.OutcomeFailed, Reason: kube.ReasonPrepare})
		if relErr != nil {
			released = "not released (" + failure.OneLine(relErr.Error()) + ")"
		}
		return failure.SystemError(nil, "the egress proxy of pool %s (%s) refused the job's egress grant: %s; %s", pool.Name, pool.EgressProxy, failure.OneLine(err.Error()), released)
	}
	env.Log().Infof("Egress of this job through the egress proxy of pool %s: %s (until the job ends); anything else is refused and named in this log", pool.Name, strings.Join(slices.Concat(grant.Instance, grant.Allow), ", "))
	return nil
}
