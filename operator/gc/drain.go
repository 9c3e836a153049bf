package gc

import (
	"context"
	"fmt"
	"time"

	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/stages"
)

// boundDrains ends the jobs that hold a node's drain too long. The chart's PodDisruptionBudget
// refuses every eviction of a claimed pod, so `kubectl drain` waits for the job; a job that runs
// for hours would hold the node as long. A job whose pod sits on a cordoned node is marked when
// gc first sees it there (the Node records no time for its cordon) and, once opts.DrainTimeout
// has passed since, its pod is deleted with the reason written on its claim, which the job's
// stage puts in the job log as a system failure naming the drain. A node uncordoned before that
// clears the mark. Jobs reaped above are skipped; a dry run only reports.
func boundDrains(ctx context.Context, env *stages.Env, claimer *kube.Claimer, jobs []kube.ClaimInfo, now time.Time, opts Options) error {
	pods, err := claimer.JobPods(ctx, env.Config.Namespace)
	if err != nil {
		return err
	}
	cordoned := map[string]bool{}
	for _, job := range jobs {
		pod, ok := pods.Of(job)
		if !ok || job.Deleting || expired(job, now, opts.OlderThan) != "" {
			continue
		}
		held, known := cordoned[pod.Node]
		if !known {
			if held, err = claimer.NodeCordoned(ctx, pod.Node); err != nil {
				return err
			}
			cordoned[pod.Node] = held
		}
		var line string
		what := fmt.Sprintf("%s/%s (job %s, pod %s on node %s)", job.Namespace, job.Name, job.JobID, pod.Name, pod.Node)
		switch {
		case !held && job.DrainSeen.IsZero():
			continue
		case !held:
			if opts.Delete {
				err = claimer.MarkDrainSeen(ctx, job, time.Time{})
			}
			line = fmt.Sprintf("drain over: %s: the node is schedulable again", what)
		case job.DrainSeen.IsZero():
			if opts.Delete {
				err = claimer.MarkDrainSeen(ctx, job, now)
			}
			line = fmt.Sprintf("drain held: %s: the node is cordoned; gc ends the job after %s", what, opts.DrainTimeout)
		case now.Sub(job.DrainSeen) < opts.DrainTimeout:
			line = fmt.Sprintf("drain held: %s: since %s; gc ends the job in %s", what,
				job.DrainSeen.UTC().Format(time.RFC3339), (opts.DrainTimeout - now.Sub(job.DrainSeen)).Round(time.Second))
		default:
			verb := "would end"
			if opts.Delete {
				verb = "ended"
				err = claimer.EndJob(ctx, job, pod, kube.DrainEnded(pod.Node, job.DrainSeen, opts.DrainTimeout))
			}
			line = fmt.Sprintf("%s %s: it held the drain past %s", verb, what, opts.DrainTimeout)
		}
		if err != nil {
			return err
		}
		fmt.Fprintln(env.Stdout, line)
	}
	return nil
}
