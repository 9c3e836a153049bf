package main

import (
	"bytes"
	"os"
	"path/filepath"
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
