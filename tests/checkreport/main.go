// Command checkreport ends `make check`'s summary (tests/check.sh): the slowest tests of the run,
// read from the suites' `go test -json` files, and a one-line warning naming the suites over
// their budgets (the table in tests/README.md) when the whole check took longer than its limit.
// A warning, not a failure: timings are noisy.
//
//	checkreport -dir CHECK_LOG_DIR [-budgets tests/README.md] [-limit 30m] [-top 10] SUITE=SECONDS...
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
