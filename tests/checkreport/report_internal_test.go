package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

const e2eEvents = `{"Action":"run","Package":"x/tests/e2e","Test":"TestA"}
build output that is not JSON
{"Action":"pass","Package":"x/tests/e2e","Test":"TestA/sub","Elapsed":300}
{"Action":"pass","Package":"x/tests/e2e","Test":"TestA","Elapsed":301.2}
{"Action":"fail","Package":"x/tests/e2e","Test":"TestB","Elapsed":12}
{"Action":"skip","Package":"x/tests/e2e","Test":"TestC","Elapsed":0}
{"Action":"output","Package":"x/tests/e2e","Test":"TestD","Output":"--- PASS: TestD (999.00s)\n"}
{"Action":"pass","Package":"x/tests/e2e","Elapsed":320}
`

func TestReadTestTimesTakesTopLevelTestsThatEnded(t *testing.T) {
	times, err := ReadTestTimes("e2e", strings.NewReader(e2eEvents))
	if err != nil {
		t.Fatal(err)
	}
	want := []TestTime{
		{"e2e", "TestA", 301200 * time.Millisecond},
		{"e2e", "TestB", 12 * time.Second},
		{"e2e", "TestC", 0},
	}
	if len(times) != len(want) {
		t.Fatalf("got %v, want %v", times, want)
	}
	for i := range want {
		if times[i] != want[i] {
			t.Errorf("test %d: got %v, want %v", i, times[i], want[i])
		}
	}
}

func TestSlowestListsTheLongestFirstAndAtMostN(t *testing.T) {
	times := []TestTime{{"unit", "TestQuick", time.Second}, {"e2e", "TestLong", time.Hour}, {"security", "TestMid", time.Minute}, {"e2e", "TestMid", time.Minute}}
	got := Slowest(times, 3)
	want := []string{"TestLong", "TestMid", "TestMid"}
	if len(got) != 3 || got[0].Test != want[0] || got[1].Suite != "e2e" || got[2].Suite != "security" {
		t.Fatalf("got %v, want %v with e2e's TestMid before security's", got, want)
	}
	if len(Slowest(times, 10)) != 4 {
		t.Fatal("Slowest must return every test when there are fewer than n")
	}
}

const readme = "# Tests\n\n| Suite | Budget | Runs |\n|---|---|---|\n| `lint` | 2m | alone |\n| `e2e` | 9m30s | in parallel |\n\nafter the table\n| `ignored` | 1m |\n"

func TestParseBudgetsReadsTheTable(t *testing.T) {
	budgets, err := ParseBudgets(strings.NewReader(readme))
	if err != nil {
		t.Fatal(err)
	}
	if len(budgets) != 2 || budgets["lint"] != 2*time.Minute || budgets["e2e"] != 9*time.Minute+30*time.Second {
		t.Fatalf("got %v", budgets)
	}
}

func TestParseBudgetsNamesTheBadLine(t *testing.T) {
	for name, text := range map[string]string{
		"no table":    "# Tests\n",
		"bad budget":  "| Suite | Budget |\n|---|---|\n| `e2e` | soon |\n",
		"no quotes":   "| Suite | Budget |\n|---|---|\n| e2e | 9m |\n",
		"zero budget": "| Suite | Budget |\n|---|---|\n| `e2e` | 0s |\n",
	} {
		_, err := ParseBudgets(strings.NewReader(text))
		if err == nil {
			t.Errorf("%s: no error", name)
			continue
		}
		if name != "no table" && !strings.Contains(err.Error(), "line 3") {
			t.Errorf("%s: %v does not name line 3", name, err)
		}
	}
}

func TestOverBudgetWarnsOnlyOverTheLimitAndNamesTheSuites(t *testing.T) {
	budgets := map[string]time.Duration{"unit": 5 * time.Minute, "e2e": 12 * time.Minute, "security": 8 * time.Minute}
	within := []SuiteTime{{"unit", 6 * time.Minute}, {"e2e", 10 * time.Minute}}
	if got := OverBudget(within, budgets, 30*time.Minute); got != "" {
		t.Fatalf("a check within its limit warned: %q", got)
	}
	over := []SuiteTime{{"unit", 4 * time.Minute}, {"e2e", 33*time.Minute + 17*time.Second}, {"security", 9 * time.Minute}}
	got := OverBudget(over, budgets, 30*time.Minute)
	want := "warning: make check took 46m17s, over its 30m00s budget; over their budgets (tests/README.md): e2e 33m17s (budget 12m00s), security 9m00s (budget 8m00s)"
	if got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
	if strings.Contains(got, "\n") {
		t.Fatal("the warning must be one line")
	}
}

func TestRunPrintsTheSlowestAndTheWarning(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "e2e.json"), []byte(e2eEvents), 0o600); err != nil {
		t.Fatal(err)
	}
	budgetFile := filepath.Join(dir, "README.md")
	if err := os.WriteFile(budgetFile, []byte(readme), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := run([]string{"-dir", dir, "-budgets", budgetFile, "-top", "2", "lint=60", "e2e=1900"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	want := "the 2 slowest tests of this run:\n     5m01s  e2e          TestA\n     0m12s  e2e          TestB\n" +
		"warning: make check took 32m40s, over its 30m00s budget; over their budgets (tests/README.md): e2e 31m40s (budget 9m30s)\n"
	if stdout.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", stdout.String(), want)
	}
}

// smokeLog is a perf-smoke log: go test's lines, the smoke's BENCH rows (with and without a
// ratio) and another benchmark's row with a ratio.
const smokeLog = `=== RUN   BenchmarkSmoke
BENCH smoke: warm claim->Ready (agent-sandbox) n=5 median=60.0ms p95=80.0ms min=50.0ms max=80.0ms
BENCH smoke: warm prepare at rest n=5 median=90.0ms p95=99.0ms min=80.0ms max=99.0ms ratio=1.50x
BENCH smoke: hello job at rest    n=5 median=900.0ms p95=990.0ms min=800.0ms max=990.0ms ratio=3.01x
BENCH smoke: hello jobs back to back n=5 median=1800.0ms p95=1900.0ms min=900.0ms max=1900.0ms ratio=2.00x
BENCH hello job, pool at rest      n=7 median=742.6ms p95=902.6ms min=581.5ms max=902.6ms ratio=6.98x
ok  	x/tests/e2e	80.1s
`

// committedSmoke is docs/benchmarks.md's section of the smoke, without the BENCH prefix; the
// back-to-back row is not there.
const committedSmoke = "## Performance smoke (make check)\n\n```\n" +
	"smoke: warm prepare at rest n=5 median=80.0ms p95=99.0ms min=70.0ms max=99.0ms ratio=1.20x\n" +
	"smoke: hello job at rest    n=5 median=800.0ms p95=990.0ms min=700.0ms max=990.0ms ratio=2.00x\n```\n"

func TestReadSmokeRatiosTakesTheSmokesRowsWithARatio(t *testing.T) {
	ratios, err := ReadSmokeRatios(strings.NewReader(smokeLog))
	if err != nil {
		t.Fatal(err)
	}
	want := []SmokeRatio{{"smoke: warm prepare at rest", 1.5}, {"smoke: hello job at rest", 3.01}, {"smoke: hello jobs back to back", 2}}
	if !slices.Equal(ratios, want) {
		t.Fatalf("got %v, want %v", ratios, want)
	}
	committed, err := ReadSmokeRatios(strings.NewReader(committedSmoke))
	if err != nil {
		t.Fatal(err)
	}
	if len(committed) != 2 || committed[1] != (SmokeRatio{"smoke: hello job at rest", 2}) {
		t.Fatalf("docs/benchmarks.md's rows: got %v", committed)
	}
}

func TestCompareSmokeWarnsOnlyMoreThanHalfWorse(t *testing.T) {
	run := []SmokeRatio{{"smoke: a", 1.5}, {"smoke: b", 1.51}, {"smoke: c", 0.5}, {"smoke: new", 9}}
	committed := []SmokeRatio{{"smoke: a", 1}, {"smoke: b", 1}, {"smoke: c", 1}}
	lines, warnings := CompareSmoke(run, committed, "docs/benchmarks.md")
	wantLines := []string{
		"smoke: a     1.50x  (committed 1.00x)",
		"smoke: b     1.51x  (committed 1.00x)",
		"smoke: c     0.50x  (committed 1.00x)",
		"smoke: new   9.00x  (no committed figure)",
	}
	if !slices.Equal(lines, wantLines) {
		t.Fatalf("got lines\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(wantLines, "\n"))
	}
	// 1.5 times is not more than half worse; a row without a committed figure never warns.
	wantWarnings := []string{"warning: performance smoke: smoke: b 1.51x against 1.00x in docs/benchmarks.md"}
	if !slices.Equal(warnings, wantWarnings) {
		t.Fatalf("got warnings %q, want %q", warnings, wantWarnings)
	}
}

func TestRunPrintsTheSmokeAgainstTheCommittedRatios(t *testing.T) {
	dir := t.TempDir()
	benchmarks := filepath.Join(dir, "benchmarks.md")
	budgetFile := filepath.Join(dir, "README.md")
	for name, text := range map[string]string{"perf-smoke.log": smokeLog, benchmarks: committedSmoke, budgetFile: readme} {
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(name)), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var stdout, stderr bytes.Buffer
	code := run([]string{"-dir", dir, "-budgets", budgetFile, "-benchmarks", benchmarks, "lint=60", "perf-smoke=80"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	want := "performance smoke, ratios to baselines of the same run (committed: " + benchmarks + "):\n" +
		"  smoke: warm prepare at rest      1.50x  (committed 1.20x)\n" +
		"  smoke: hello job at rest         3.01x  (committed 2.00x)\n" +
		"  smoke: hello jobs back to back   2.00x  (no committed figure)\n" +
		"warning: performance smoke: smoke: hello job at rest 3.01x against 2.00x in " + benchmarks + "\n"
	if stdout.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", stdout.String(), want)
	}

	// A smoke that broke has no ratios: said in one line, no warning.
	if err := os.WriteFile(filepath.Join(dir, "perf-smoke.log"), []byte("--- FAIL: BenchmarkSmoke\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stdout.Reset()
	if code := run([]string{"-dir", dir, "-budgets", budgetFile, "-benchmarks", benchmarks, "perf-smoke=80"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if got := stdout.String(); strings.Count(got, "\n") != 1 || !strings.Contains(got, "no ratios") {
		t.Fatalf("a broken smoke: got %q", got)
	}
}

func TestRunRefusesBadArgumentsInOneLine(t *testing.T) {
	for _, args := range [][]string{{"e2e=60"}, {"-dir", t.TempDir(), "e2e"}, {"-dir", t.TempDir(), "e2e=soon"}} {
		var stdout, stderr bytes.Buffer
		if code := run(args, &stdout, &stderr); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
		if lines := strings.Count(stderr.String(), "\n"); lines != 1 {
			t.Errorf("%v: %d lines of error, want 1: %q", args, lines, stderr.String())
		}
	}
}

func FuzzParseBudgets(f *testing.F) {
	f.Add(readme)
	f.Add("| Suite | Budget |\n|---|---|\n| `e2e` | soon |\n")
	f.Fuzz(func(t *testing.T, text string) {
		budgets, err := ParseBudgets(strings.NewReader(text))
		if err != nil {
			return
		}
		for name, budget := range budgets {
			if name == "" || budget <= 0 {
				t.Fatalf("accepted suite %q with budget %v", name, budget)
			}
		}
	})
}
