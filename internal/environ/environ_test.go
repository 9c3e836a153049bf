package environ_test

import (
	"slices"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/internal/environ"
)

func TestLookupTheLastDuplicateWins(t *testing.T) {
	env := []string{"A=first", "AB=other", "A=last", "B="}
	for name, want := range map[string]string{"A": "last", "AB": "other", "B": "", "C": "", "": ""} {
		if got := environ.Lookup(env, name); got != want {
			t.Errorf("Lookup(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestWithoutRemovesEveryEntryAndKeepsTheInput(t *testing.T) {
	env := []string{"TOKEN=a", "TOKENS=b", "PATH=/bin", "TOKEN=c"}
	if got, want := environ.Without(env, "TOKEN"), []string{"TOKENS=b", "PATH=/bin"}; !slices.Equal(got, want) {
		t.Errorf("Without = %q, want %q", got, want)
	}
	if env[0] != "TOKEN=a" {
		t.Errorf("Without changed its input: %q", env)
	}
}
