package main

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The markdown tables.

// pct is the p quantile (0..1) of sorted durations, by nearest rank.
func pct(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.999999) - 1 // nearest rank
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

func (b *bench) report() string {
	var s strings.Builder
	fmt.Fprintf(&s, "%d kwok nodes. The agent-sandbox controller runs in-cluster: Deployment %s/%s, one pod (its CPU: its container's process on this node; its metrics: through the API server's pod proxy), args as found `%s`.\n",
		b.nodes, b.ctrl.Namespace, b.ctrl.Name, strings.Join(b.ctrl.Original, " "))
	s.WriteString("Controller settings (column \"flags\"; any other than the args as found is rolled out before its rounds, and the args as found are rolled back out at the end; workers as the controller reported them):\n\n")
	for i, extra := range b.settingList() {
		desc := "args as found"
		if len(extra) > 0 {
			desc = "`" + strings.Join(extra, " ") + "`"
		}
		fmt.Fprintf(&s, "- %s: %s; %s workers\n", settingName(i), desc, b.settingWorkers(i))
	}
	s.WriteString("\n")
	fmt.Fprintf(&s, "Claims fired at once, each on its own connection through the executor's claim path (client QPS %g, burst %d per connection).\n", b.o.qps, b.o.burst)
	s.WriteString("Ready: create -> claim Ready as seen on a watch of all claims; Claim(): the executor's whole call (create, its own watch, resolve). Times in ms.\n\n")
	s.WriteString("| flags | path | N | n | p50 | p95 | p99 | max | Claim() p50 | Claim() p99 | claims/s | warm hits | errors | pool fill s | cleanup s |\n")
	s.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range b.rows {
		kind := kindName(r.warm)
		rate := 0.0
		if r.wall > 0 {
			rate = float64(r.ok) / r.wall.Seconds()
		}
		fmt.Fprintf(&s, "| %s | %s | %d | %d | %s | %s | %s | %s | %s | %s | %.0f | %d | %d | %.1f | %.1f |\n", settingName(r.setting), kind, r.n, len(r.ready),
			ms(pct(r.ready, .50)), ms(pct(r.ready, .95)), ms(pct(r.ready, .99)), ms(pct(r.ready, 1)),
			ms(pct(r.claim, .50)), ms(pct(r.claim, .99)), rate, r.warmHits, len(r.errs), r.poolFill.Seconds(), r.cleanup.Seconds())
	}
	pl := b.priorityLevel
	if pl == "" {
		pl = "unknown"
	}
	s.WriteString("\nWhere the time went during each burst: CPU seconds per process (2 cores = 2 s per wall second; \"others\" is the\n")
	s.WriteString("rest of the machine: other users of this shared host), API priority and fairness for the controller (priority\n")
	fmt.Fprintf(&s, "level %s, where the API server puts the controller's ServiceAccount), the controller's mean workqueue wait and\n", pl)
	s.WriteString("reconcile time, the API server's mean time per non-watch request on agent-sandbox resources, and API writes per\n")
	s.WriteString("claim (cluster-wide: other users' writes included).\n\n")
	s.WriteString("| flags | path | N | wall s | load avg |")
	for _, c := range components {
		fmt.Fprintf(&s, " %s |", c)
	}
	s.WriteString(" bench | others | APF wait ms | APF rejected | claim queue ms | claim work ms | sandbox queue ms | pool queue ms | API server ms | writes/claim |\n|")
	s.WriteString(strings.Repeat("---|", 5+len(components)+10) + "\n")
	for _, r := range b.rows {
		kind := kindName(r.warm)
		fmt.Fprintf(&s, "| %s | %s | %d | %.1f | %s |", settingName(r.setting), kind, r.n, r.wall.Seconds(), r.load)
		ours := 0.0
		for _, c := range append(slices.Clone(components), "bench") {
			v, ok := r.cpu[c]
			if !ok {
				s.WriteString(" - |")
				continue
			}
			ours += v
			fmt.Fprintf(&s, " %.1f |", v)
		}
		others := "-"
		if busy, ok := r.cpu[machine]; ok {
			others = fmt.Sprintf("%.1f", busy-ours)
		}
		writes := 0.0
		for _, v := range r.writes {
			writes += v
		}
		apfWait, apfRejected := "-", "-"
		if b.priorityLevel != "" {
			apfWait, apfRejected = fmt.Sprintf("%.1f", 1000*mean(r.apfWait, r.apfDispatched)), fmt.Sprintf("%.0f", r.apfReject)
		}
		fmt.Fprintf(&s, " %s | %s | %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.1f |\n", others, apfWait, apfRejected,
			1000*r.queueWait["sandboxclaim"], 1000*r.work["sandboxclaim"], 1000*r.queueWait["sandbox"], 1000*r.queueWait["sandboxwarmpool"],
			1000*r.serverMean, writes/float64(r.n))
	}
	s.WriteString("\nAPI writes per claim during the burst, by resource (refill of the pool included):\n\n")
	for _, r := range b.rows {
		kind := kindName(r.warm)
		res := slices.Collect(maps.Keys(r.writes))
		slices.SortFunc(res, func(a, b string) int { return int(r.writes[b] - r.writes[a]) })
		var parts []string
		for _, k := range res {
			if per := r.writes[k] / float64(r.n); per >= 0.05 {
				parts = append(parts, fmt.Sprintf("%s %.1f", k, per))
			}
		}
		fmt.Fprintf(&s, "- %s %s N=%d: %s\n", settingName(r.setting), kind, r.n, strings.Join(parts, ", "))
	}
	for _, r := range b.rows {
		if r.controllerRestarted {
			fmt.Fprintf(&s, "\n%s %s N=%d: the controller's container restarted during the burst: no controller CPU or queue figures.\n", settingName(r.setting), kindName(r.warm), r.n)
		}
	}
	for _, r := range b.rows {
		if len(r.errs) > 0 {
			fmt.Fprintf(&s, "\n%s N=%d: first error: %s\n", settingName(r.setting), r.n, r.errs[0])
		}
	}
	return s.String()
}

// settingName labels a controller setting in the tables: A, B, C, ...
func settingName(i int) string {
	if i < 26 {
		return string(rune('A' + i))
	}
	return strconv.Itoa(i + 1)
}

// settingWorkers is the workers the controller reported in the first round of setting i.
func (b *bench) settingWorkers(i int) string {
	for _, r := range b.rows {
		if r.setting == i {
			return r.workers
		}
	}
	return "unknown"
}

func kindName(warm bool) string {
	if warm {
		return "warm"
	}
	return "cold"
}
