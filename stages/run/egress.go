package run

import (
	"context"
	"fmt"
	"time"

	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
	"github.com/sandbox-executor/sandbox-executor/gitlab"
	"github.com/sandbox-executor/sandbox-executor/stages"
)

// maxBlockedLines bounds the warnings per stage.
const maxBlockedLines = 20

// reportBlocked warns in the job log about every destination the pool's egress proxy refused
// to the pod since the stage started, once per destination. It never fails the job.
func reportBlocked(ctx context.Context, env *stages.Env, log *gitlab.JobLog, pool *config.Pool, podIP string, since time.Time) {
	if pool == nil || pool.EgressProxy == "" || podIP == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), adminclient.Timeout)
	defer cancel()
	admin, err := env.EgressAdmin(pool)
	var b *adminclient.Blocked
	if err == nil {
		b, err = admin.QueryBlocked(ctx, podIP, since)
	}
	if err != nil {
		log.Warnf("egress proxy %s: cannot list blocked attempts: %v", pool.EgressProxy, err)
		return
	}
	type attempt struct{ method, dest, reason string }
	var order []attempt
	count := map[attempt]int{}
	for _, d := range b.Blocked {
		a := attempt{d.Method, d.Dest, d.Reason}
		if count[a] == 0 {
			order = append(order, a)
		}
		count[a]++
	}
	for i, a := range order {
		if i == maxBlockedLines {
			log.Warnf("egress blocked: %d more destinations; the egress proxy's log has them all", len(order)-i)
			break
		}
		detail := a.reason + "; pool " + pool.Name
		if a.reason == adminclient.ReasonNotAllowed {
			detail = a.reason + " of pool " + pool.Name
		}
		if n := count[a]; n > 1 {
			detail += fmt.Sprintf("; %d attempts", n)
		}
		log.Warnf("egress blocked: %s %s (%s)", a.method, a.dest, detail)
	}
	if b.Truncated {
		log.Warnf("egress blocked: more attempts than the egress proxy keeps per pod; its log has them all")
	}
}
