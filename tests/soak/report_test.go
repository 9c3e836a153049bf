//go:build soak

package soak

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
)

// The invariants, checked over every job of the run.
const (
	invEnds      = "every job ends, none past its timeout plus the margin"
	invExact     = "no job succeeds without exactly what it printed"
	invUnfaulted = "a job no fault touched ends as its kind must"
	invFaulted   = "a job a fault touched ends as its kind must, or as a system failure"
	invLeftovers = "after the run and one gc, no claim, claimed sandbox or job pod is left"
	invGrants    = "no egress grant is left"
	invSentinel  = "the masked sentinel and ID token are in no record, event, log or trace"
	invInternet  = "no job reaches the internet"
	invHealthy   = "the cluster, the runner and its stage server are healthy at the end"
	invExporter  = "the exporter's job counters agree with GitLab's outcomes"
)

var invariants = []string{invEnds, invExact, invUnfaulted, invFaulted, invLeftovers, invGrants, invSentinel, invInternet, invHealthy, invExporter}

type violations struct {
	byInvariant map[string][]string
}

func (v *violations) add(inv, format string, args ...any) {
	if v.byInvariant == nil {
		v.byInvariant = map[string][]string{}
	}
	v.byInvariant[inv] = append(v.byInvariant[inv], fmt.Sprintf(format, args...))
}

func kindCounts(jobs []*soakJob) string {
	counts := map[string]int{}
	var names []string
	for _, s := range jobs {
		if counts[s.kind.name] == 0 {
			names = append(names, s.kind.name)
		}
		counts[s.kind.name]++
	}
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %d", n, counts[n]))
	}
	return strings.Join(parts, ", ")
}

// report is the run in markdown: jobs by kind and outcome, faults by kind, every invariant with
// its count of violations, and job times with and without faults.
func report(s settings, jobs []*soakJob, faults []*fault, v *violations, took time.Duration, restarts []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Soak run: %d jobs, seed %d, %s from the first hand-out to the last job's end (`SOAK_JOBS=%d SOAK_SEED=%d make soak` replays it).\n\n",
		len(jobs), s.seed, took.Round(time.Second), len(jobs), s.seed)

	outcomes := []string{"success", "failed (script)", "failed (system)", "failed (timeout)", "failed (other)", "canceled", "abandoned", "not ended"}
	b.WriteString("| Kind | Jobs | Touched by a fault | " + strings.Join(outcomes, " | ") + " |\n|---|---:|---:|" + strings.Repeat("---:|", len(outcomes)) + "\n")
	var kindsSeen []string
	rows := map[string]map[string]int{}
	for _, j := range jobs {
		if rows[j.kind.name] == nil {
			rows[j.kind.name] = map[string]int{}
			kindsSeen = append(kindsSeen, j.kind.name)
		}
		row := rows[j.kind.name]
		row["jobs"]++
		if j.faulted || j.abandoned {
			row["faulted"]++
		}
		row[outcomeColumn(j)]++
	}
	for _, k := range kindsSeen {
		row := rows[k]
		fmt.Fprintf(&b, "| %s | %d | %d |", k, row["jobs"], row["faulted"])
		for _, o := range outcomes {
			fmt.Fprintf(&b, " %d |", row[o])
		}
		b.WriteString("\n")
	}

	// A targeted fault with no job pod at its moment waits for one: it fires late, or is
	// skipped when the run ends first.
	b.WriteString("\n| Fault | Scheduled | Fired | of which late (waited for a job pod) | Skipped (the run ended first) | Errors |\n|---|---:|---:|---:|---:|---:|\n")
	for _, k := range faultKinds {
		var n, fired, late, skipped, errs int
		for _, f := range faults {
			if f.kind != k {
				continue
			}
			n++
			switch {
			case f.skipped != "":
				skipped++
			case !f.begin.IsZero():
				fired++
				if f.waited > 0 {
					late++
				}
			}
			if f.err != nil {
				errs++
			}
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d |\n", k, n, fired, late, skipped, errs)
	}

	if len(restarts) > 0 {
		fmt.Fprintf(&b, "\nControl-plane daemons that exited and the soak's supervisor started again: %s.\n", strings.Join(restarts, ", "))
	}

	b.WriteString("\n| Invariant | Violations |\n|---|---:|\n")
	for _, inv := range invariants {
		fmt.Fprintf(&b, "| %s | %d |\n", inv, len(v.byInvariant[inv]))
	}

	var clean, hit []time.Duration
	for _, j := range jobs {
		if !j.ended || j.result.HandedOutAt.IsZero() || j.kind.cancel || j.kind.name == "timeout" {
			continue
		}
		if j.faulted {
			hit = append(hit, j.result.Duration())
		} else {
			clean = append(clean, j.result.Duration())
		}
	}
	b.WriteString("\nJob time, hand-out to final state (all kinds but cancel and timeout, whose times the soak sets):\n\n| Jobs | n | p50 | p99 |\n|---|---:|---:|---:|\n")
	for _, row := range []struct {
		name string
		d    []time.Duration
	}{{"no fault touched them", clean}, {"touched by a fault", hit}} {
		p50, p99 := percentile(row.d, 50), percentile(row.d, 99)
		fmt.Fprintf(&b, "| %s | %d | %s | %s |\n", row.name, len(row.d), p50, p99)
	}
	return b.String()
}

func outcomeColumn(j *soakJob) string {
	res := j.result
	switch {
	case !j.ended && j.abandoned:
		return "abandoned"
	case !j.ended:
		return "not ended"
	case res.State == fakegitlab.StateSuccess:
		return "success"
	case res.State == fakegitlab.StateCanceled:
		return "canceled"
	case res.FailureReason == fakegitlab.FailureScript:
		return "failed (script)"
	case res.FailureReason == fakegitlab.FailureSystem:
		return "failed (system)"
	case res.FailureReason == fakegitlab.FailureTimeout:
		return "failed (timeout)"
	}
	return "failed (other)"
}

func percentile(d []time.Duration, p int) string {
	if len(d) == 0 {
		return "-"
	}
	sorted := slices.Clone(d)
	slices.Sort(sorted)
	i := (len(sorted)*p + 99) / 100
	i = min(max(i-1, 0), len(sorted)-1)
	return sorted[i].Round(10 * time.Millisecond).String()
}
