package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// TestTime is one top-level test of a suite and how long it ran (for a parallel test, without
// the time it waited for its turn, as go test counts it).
type TestTime struct {
	Suite   string
	Test    string
	Elapsed time.Duration
}

// testEvent is the part of a `go test -json` event (test2json) the report reads.
type testEvent struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
}

// ReadTestTimes reads a suite's `go test -json` events and returns the time of each top-level
// test that ended (passed, failed or skipped). Subtests are left out: their time is inside their
// parent's. Lines that are not JSON events (a build's output) are skipped.
func ReadTestTimes(suite string, events io.Reader) ([]TestTime, error) {
	var times []TestTime
	scanner := bufio.NewScanner(events)
	scanner.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for scanner.Scan() {
		var e testEvent
		if json.Unmarshal(scanner.Bytes(), &e) != nil {
			continue
		}
		switch e.Action {
		case "pass", "fail", "skip":
		default:
			continue
		}
		if e.Test == "" || strings.Contains(e.Test, "/") {
			continue
		}
		times = append(times, TestTime{Suite: suite, Test: e.Test, Elapsed: time.Duration(e.Elapsed * float64(time.Second))})
	}
	return times, scanner.Err()
}

// Slowest returns the n longest tests, longest first (ties by suite and name, so the list is
// the same for the same run).
func Slowest(times []TestTime, n int) []TestTime {
	sorted := slices.Clone(times)
	slices.SortFunc(sorted, func(a, b TestTime) int {
		return cmp.Or(cmp.Compare(b.Elapsed, a.Elapsed), cmp.Compare(a.Suite, b.Suite), cmp.Compare(a.Test, b.Test))
	})
	return sorted[:min(n, len(sorted))]
}

// SuiteTime is how long one suite of the check took.
type SuiteTime struct {
	Suite string
	Took  time.Duration
}

// budgetTableHeader starts the budget table in tests/README.md: | Suite | Budget | ...
const budgetTableHeader = "| suite | budget |"

// ParseBudgets reads the per-suite budgets from the table in tests/README.md whose header
// starts with "| Suite | Budget |": one row per suite, the suite's name in backquotes, the budget
// a Go duration ("9m", "90s"). Its error names the line that is wrong.
func ParseBudgets(readme io.Reader) (map[string]time.Duration, error) {
	budgets := map[string]time.Duration{}
	scanner := bufio.NewScanner(readme)
	inTable, line := false, 0
	for scanner.Scan() {
		line++
		text := strings.TrimSpace(scanner.Text())
		if !inTable {
			inTable = strings.HasPrefix(strings.ToLower(text), budgetTableHeader)
			continue
		}
		if !strings.HasPrefix(text, "|") {
			break
		}
		cells := strings.Split(strings.Trim(text, "|"), "|")
		if len(cells) < 2 || strings.Trim(strings.TrimSpace(cells[0]), "-:") == "" {
			continue // the separator row
		}
		name := strings.TrimSpace(cells[0])
		if len(name) < 3 || !strings.HasPrefix(name, "`") || !strings.HasSuffix(name, "`") {
			return nil, fmt.Errorf("line %d: a suite's name goes in backquotes, got %q", line, name)
		}
		budget, err := time.ParseDuration(strings.TrimSpace(cells[1]))
		if err != nil || budget <= 0 {
			return nil, fmt.Errorf("line %d: suite %s: budget %q is not a positive duration like 9m", line, name, strings.TrimSpace(cells[1]))
		}
		budgets[strings.Trim(name, "`")] = budget
	}
	if err := scanner.Err(); err != nil {
		return nil, err
	}
	if len(budgets) == 0 {
		return nil, fmt.Errorf("no budget table (a header starting %q)", budgetTableHeader)
	}
	return budgets, nil
}

// OverBudget returns the warning to print when the whole check took longer than limit: one
// line naming each suite over its own budget. It returns "" when the check kept to its limit.
func OverBudget(suites []SuiteTime, budgets map[string]time.Duration, limit time.Duration) string {
	var total time.Duration
	var over []string
	for _, s := range suites {
		total += s.Took
		if budget, ok := budgets[s.Suite]; ok && s.Took > budget {
			over = append(over, fmt.Sprintf("%s %s (budget %s)", s.Suite, minutes(s.Took), minutes(budget)))
		}
	}
	if total <= limit {
		return ""
	}
	warning := fmt.Sprintf("warning: make check took %s, over its %s budget; ", minutes(total), minutes(limit))
	if len(over) == 0 {
		return warning + "no suite is over its own budget (tests/README.md): the budgets add up to more than the whole"
	}
	return warning + "over their budgets (tests/README.md): " + strings.Join(over, ", ")
}

// minutes formats a duration as check.sh does: 33m17s.
func minutes(d time.Duration) string {
	s := int(d.Round(time.Second) / time.Second)
	return fmt.Sprintf("%dm%02ds", s/60, s%60)
}

// SmokeRatio is one row of the performance smoke (tests/e2e/bench_smoke_test.go, the perf-smoke
// suite) that has a ratio: the row's name and its ratio to the baseline of the same run.
type SmokeRatio struct {
	Row   string
	Ratio float64
}

// smokeRatioLine is a smoke row with a ratio, as BenchmarkSmoke prints it (after "BENCH " in its
// log) and as docs/benchmarks.md keeps it: "smoke: NAME  n=5 median=... ratio=1.23x".
var smokeRatioLine = regexp.MustCompile(`^(?:BENCH )?(smoke: .*?)\s+n=\d+ .* ratio=(\d+(?:\.\d+)?)x\s*$`)

// ReadSmokeRatios reads the smoke's rows that have a ratio, in their order, from the perf-smoke
// log or from docs/benchmarks.md; other lines are skipped.
func ReadSmokeRatios(text io.Reader) ([]SmokeRatio, error) {
	var ratios []SmokeRatio
	scanner := bufio.NewScanner(text)
	scanner.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for scanner.Scan() {
		m := smokeRatioLine.FindStringSubmatch(strings.TrimSpace(scanner.Text()))
		if m == nil {
			continue
		}
		ratio, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			continue
		}
		ratios = append(ratios, SmokeRatio{Row: m[1], Ratio: ratio})
	}
	return ratios, scanner.Err()
}

// smokeWorseBy is how much worse than its committed figure a smoke ratio must be for a warning:
// more than half (a ratio over 1.5 times the committed one). Timings are noisy; the smoke is a
// guard against a regression of that size, not a measurement.
const smokeWorseBy = 1.5

// CompareSmoke sets the ratios of this run against the committed ones (docs/benchmarks.md): one
// line per ratio of the run, with its committed figure or "no committed figure", and one warning
// per ratio more than half worse than its committed figure.
func CompareSmoke(run, committed []SmokeRatio, committedIn string) (lines, warnings []string) {
	figures := map[string]float64{}
	for _, c := range committed {
		if _, ok := figures[c.Row]; !ok {
			figures[c.Row] = c.Ratio
		}
	}
	width := 0
	for _, r := range run {
		width = max(width, len(r.Row))
	}
	for _, r := range run {
		figure, ok := figures[r.Row]
		if !ok {
			lines = append(lines, fmt.Sprintf("%-*s %6.2fx  (no committed figure)", width, r.Row, r.Ratio))
			continue
		}
		lines = append(lines, fmt.Sprintf("%-*s %6.2fx  (committed %.2fx)", width, r.Row, r.Ratio, figure))
		if r.Ratio > smokeWorseBy*figure {
			warnings = append(warnings, fmt.Sprintf("warning: performance smoke: %s %.2fx against %.2fx in %s", r.Row, r.Ratio, figure, committedIn))
		}
	}
	return lines, warnings
}
