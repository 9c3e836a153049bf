package stages

import (
	"context"

	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// FencedBy names what fences the egress of a pool's pods, for the job log.
func FencedBy(pool *config.Pool) string {
	if pool != nil && pool.EgressProxy != "" {
		return "its NetworkPolicy and the egress proxy"
	}
	return "its NetworkPolicy"
}

// EgressAdmin is the admin client of pool's egress proxy, sending the token of
// egress_admin_token_file if set, and verifying an https proxy's certificate with
// egress_admin_ca_file if set.
func (e *Env) EgressAdmin(pool *config.Pool) (*adminclient.Client, error) {
	token, err := e.Config.EgressAdminToken()
	if err != nil {
		return nil, failure.PermanentError(nil, "egress_admin_token_file in %s: %v", e.Config.Path(), err)
	}
	ca, err := e.Config.EgressAdminCA()
	if err != nil {
		return nil, failure.PermanentError(nil, "egress_admin_ca_file in %s: %v", e.Config.Path(), err)
	}
	return &adminclient.Client{Base: pool.EgressProxy, Token: token, CA: ca}, nil
}

// RevokeEgress withdraws the egress grant of sbx's pod from its pool's egress proxy, so that a
// pod that gets the address next cannot use it. It runs on failure and cleanup paths, so it
// has its own time even when ctx is done, and a proxy that does not answer costs a warning:
// the grant lapses at the job's deadline anyway. Nothing for a pool without grants.
func (e *Env) RevokeEgress(ctx context.Context, sbx *kube.Sandbox) {
	if sbx == nil || sbx.PodIP == "" {
		return
	}
	pool := e.Config.Pool(sbx.Pool)
	if pool == nil || !pool.GrantsEgress() {
		return
	}
	log := e.Log()
	admin, err := e.EgressAdmin(pool)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), adminclient.Timeout)
		defer cancel()
		err = admin.DeleteGrant(ctx, sbx.PodIP)
	}
	if err != nil {
		log.Warnf("egress proxy %s: cannot withdraw the egress grant of pod %s (%s): %s; it lapses when the job's time is up", pool.EgressProxy, sbx.Pod, sbx.PodIP, failure.Line(err))
		return
	}
	log.Debugf("Withdrew the egress grant of pod %s (%s)", sbx.Pod, sbx.PodIP)
}
