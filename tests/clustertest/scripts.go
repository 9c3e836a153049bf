package clustertest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// The cluster's own scripts, for tests that break a component and bring it back. Named as on the
// main branch (tests/clustertest/whole.go), which adds WaitWhole and RestoreAfterBreak on top.

// ClusterScript runs tests/cluster/NAME with args (ctx bounds it); the output is stdout and
// stderr together.
func ClusterScript(ctx context.Context, name string, args ...string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(root, "tests", "cluster", name), args...)
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// RepoRoot is the module root: the nearest directory up from the working directory (a test's
// package directory) that holds go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}
