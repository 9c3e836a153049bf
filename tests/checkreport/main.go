// Command checkreport ends `make check`'s summary (tests/check.sh): the slowest tests of the run,
// read from the suites' `go test -json` files; when the performance smoke ran (the perf-smoke
// suite), its ratios from its log against the committed ones (docs/benchmarks.md), with a warning
// line for each more than half worse; and a one-line warning naming the suites over their
// budgets (the table in tests/README.md) when the whole check took longer than its limit.
// Warnings, not failures: timings are noisy.
//
//	checkreport -dir CHECK_LOG_DIR [-budgets tests/README.md] [-limit 30m] [-top 10]
//	    [-smoke perf-smoke] [-benchmarks docs/benchmarks.md] SUITE=SECONDS...
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet("checkreport", flag.ContinueOnError)
	flags.SetOutput(stderr)
	dir := flags.String("dir", "", "the check's log directory: SUITE.json for each go test suite")
	budgetFile := flags.String("budgets", "tests/README.md", "the file with the per-suite budget table")
	limit := flags.Duration("limit", 30*time.Minute, "the whole check's budget")
	top := flags.Int("top", 10, "how many of the slowest tests to list")
	smoke := flags.String("smoke", "perf-smoke", "the suite of the performance smoke, whose SUITE.log has its rows")
	benchmarks := flags.String("benchmarks", "docs/benchmarks.md", "the file with the smoke's committed ratios")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	suites, err := parseSuiteTimes(flags.Args())
	if err != nil || *dir == "" {
		if err == nil {
			err = fmt.Errorf("-dir is required")
		}
		fmt.Fprintf(stderr, "checkreport: %v\n", err)
		return 2
	}
	var times []TestTime
	for _, s := range suites {
		f, err := os.Open(filepath.Join(*dir, s.Suite+".json"))
		if os.IsNotExist(err) {
			continue // not a go test suite
		}
		if err != nil {
			fmt.Fprintf(stderr, "checkreport: %v\n", err)
			return 1
		}
		suiteTimes, err := ReadTestTimes(s.Suite, f)
		f.Close()
		if err != nil {
			fmt.Fprintf(stderr, "checkreport: %s.json: %v\n", s.Suite, err)
			return 1
		}
		times = append(times, suiteTimes...)
	}
	if slowest := Slowest(times, *top); len(slowest) > 0 {
		fmt.Fprintf(stdout, "the %d slowest tests of this run:\n", len(slowest))
		for _, t := range slowest {
			fmt.Fprintf(stdout, "  %8s  %-12s %s\n", minutes(t.Elapsed), t.Suite, t.Test)
		}
	}
	for _, s := range suites {
		if s.Suite == *smoke {
			if err := reportSmoke(filepath.Join(*dir, s.Suite+".log"), *benchmarks, stdout); err != nil {
				fmt.Fprintf(stderr, "checkreport: %v\n", err)
				return 1
			}
		}
	}
	f, err := os.Open(*budgetFile)
	if err != nil {
		fmt.Fprintf(stderr, "checkreport: %v\n", err)
		return 1
	}
	budgets, err := ParseBudgets(f)
	f.Close()
	if err != nil {
		fmt.Fprintf(stderr, "checkreport: %s: %v\n", *budgetFile, err)
		return 1
	}
	if warning := OverBudget(suites, budgets, *limit); warning != "" {
		fmt.Fprintln(stdout, warning)
	}
	return 0
}

// parseSuiteTimes reads the SUITE=SECONDS arguments, in the order the suites ran.
func parseSuiteTimes(args []string) ([]SuiteTime, error) {
	suites := make([]SuiteTime, 0, len(args))
	for _, arg := range args {
		name, seconds, ok := strings.Cut(arg, "=")
		n, err := strconv.Atoi(seconds)
		if !ok || name == "" || err != nil || n < 0 {
			return nil, fmt.Errorf("%q: want SUITE=SECONDS", arg)
		}
		suites = append(suites, SuiteTime{Suite: name, Took: time.Duration(n) * time.Second})
	}
	return suites, nil
}

// reportSmoke prints the performance smoke's ratios from its log against the committed ones in
// benchmarks, and a warning line for each ratio more than half worse than its committed figure.
func reportSmoke(log, benchmarks string, stdout io.Writer) error {
	run, err := readSmokeRatios(log)
	if err != nil {
		return err
	}
	if len(run) == 0 {
		fmt.Fprintf(stdout, "performance smoke: no ratios in %s (see the suite's result above)\n", log)
		return nil
	}
	committed, err := readSmokeRatios(benchmarks)
	if err != nil {
		return err
	}
	lines, warnings := CompareSmoke(run, committed, benchmarks)
	fmt.Fprintf(stdout, "performance smoke, ratios to baselines of the same run (committed: %s):\n", benchmarks)
	for _, line := range lines {
		fmt.Fprintf(stdout, "  %s\n", line)
	}
	for _, warning := range warnings {
		fmt.Fprintln(stdout, warning)
	}
	return nil
}

func readSmokeRatios(path string) ([]SmokeRatio, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ratios, err := ReadSmokeRatios(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return ratios, nil
}
