// Package gc implements the gc command: it finds this runner's claims (and, with unknown_image =
// "cold", its cold-started Sandboxes) whose jobs must be over and deletes them. A runner that dies
// never runs cleanup; the shutdownTime lets agent-sandbox reap them, and gc is the second net
// (controller down, policy changed, objects from before a config change). Dry-run unless asked to
// delete.
package gc

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/stages"
)

// Command is the gc verb and its flags.
func Command(setup stages.Setup) *cli.Command {
	return &cli.Command{
		Name:  "gc",
		Usage: "report (or with --delete, delete) this runner's claims whose jobs must be over",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "delete", Usage: "delete them; without it gc only reports"},
			&cli.DurationFlag{Name: "older-than", Usage: "also reap claims older than this, whatever their shutdownTime"},
			&cli.DurationFlag{Name: "drain-timeout", Usage: "end a job whose pod has held a drain (its node cordoned) this long since gc first saw it; 0: never"},
		},
		Action: setup(func(c *cli.Context, env *stages.Env) error {
			if c.Duration("drain-timeout") < 0 {
				return failure.PermanentError(nil, "--drain-timeout %s: want a positive duration, or 0 for no bound", c.Duration("drain-timeout"))
			}
			return Run(c.Context, env, Options{Delete: c.Bool("delete"), OlderThan: c.Duration("older-than"), DrainTimeout: c.Duration("drain-timeout")})
		}),
	}
}

// Options select what gc reaps.
type Options struct {
	// Delete deletes; otherwise gc only reports.
	Delete bool
	// OlderThan, when set, also reaps claims older than this whatever their shutdownTime.
	OlderThan time.Duration
	// DrainTimeout, when set, ends the jobs that have held a node's drain this long (boundDrains).
	DrainTimeout time.Duration
}

// Run lists this runner's claims and cold starts and reaps the expired ones, one line each on
// stdout.
func Run(ctx context.Context, env *stages.Env, opts Options) error {
	claimer, err := env.Claimer()
	if err != nil {
		return err
	}
	owned, err := claimer.RunnerClaims(ctx, env.Config.Namespace, env.Config.RunnerName)
	if err != nil {
		return err
	}
	what := "claims"
	// Listing Sandboxes needs the chart's coldStart.enabled, granted only with this policy.
	if env.Config.UnknownImage == config.UnknownImageCold {
		cold, err := claimer.RunnerColdStarts(ctx, env.Config.Namespace, env.Config.RunnerName)
		if err != nil {
			return err
		}
		owned = append(owned, cold...)
		what = "claims and cold-started Sandboxes"
	}
	now := env.Clock.Now()
	verb := "would delete"
	if opts.Delete {
		verb = "deleted"
	}
	reaped := 0
	for _, c := range owned {
		why := expired(c, now, opts.OlderThan)
		if why == "" {
			continue
		}
		release, kind := claimer.Release, ""
		if c.ColdStart {
			release, kind = claimer.ReleaseColdStart, "cold-started Sandbox, "
		}
		if opts.Delete {
			// The pod's egress grant, if its pool grants one, is found while the claim is there
			// and withdrawn once it is gone: a runner that died never withdrew it.
			grantee := granteeOf(ctx, env, claimer, c)
			// Any job's: gc is how an operator clears a claim a stage refused as another job's.
			// No outcome: the job's is unknown, and the exporter counts a claim past its
			// shutdownTime as leaked anyway.
			if err := release(ctx, c.Namespace, c.Name, kube.AnyJob, kube.Outcome{}); err != nil {
				return err
			}
			env.RevokeEgress(ctx, grantee)
		}
		reaped++
		fmt.Fprintf(env.Stdout, "%s %s/%s (%sjob %s, age %s): %s\n", verb, c.Namespace, c.Name, kind, c.JobID, now.Sub(c.Created).Round(time.Second), why)
	}
	fmt.Fprintf(env.Stdout, "%d of %d %s of runner %q %s\n", reaped, len(owned), what, env.Config.RunnerName, map[bool]string{true: "deleted", false: "to delete (dry run: pass --delete)"}[opts.Delete])
	if opts.DrainTimeout > 0 {
		return boundDrains(ctx, env, claimer, owned, now, opts)
	}
	return nil
}

// granteeOf is the sandbox of a claim gc reaps, when a pool grants egress: its pod may hold a
// grant. Nil when none grants, or when it cannot be found (the grant then lapses at its time).
func granteeOf(ctx context.Context, env *stages.Env, claimer *kube.Claimer, c kube.ClaimInfo) *kube.Sandbox {
	if !slices.ContainsFunc(env.Config.Pools, func(p config.Pool) bool { return p.GrantsEgress() }) {
		return nil
	}
	sbx, err := claimer.Find(ctx, c.Namespace, c.Name, kube.AnyJob, env.Config.RuntimeClasses)
	if err != nil {
		env.Log().Debugf("No egress grant to withdraw found for %s/%s: %s", c.Namespace, c.Name, failure.Line(err))
		return nil
	}
	return sbx
}

func expired(c kube.ClaimInfo, now time.Time, olderThan time.Duration) string {
	switch {
	case c.Deleting:
		return ""
	case !c.ShutdownTime.IsZero() && now.After(c.ShutdownTime):
		return fmt.Sprintf("shutdownTime passed %s ago", now.Sub(c.ShutdownTime).Round(time.Second))
	case c.ShutdownTime.IsZero():
		return "no shutdownTime: not made by this version, or edited"
	case olderThan > 0 && now.Sub(c.Created) > olderThan:
		return fmt.Sprintf("older than %s", olderThan)
	}
	return ""
}
