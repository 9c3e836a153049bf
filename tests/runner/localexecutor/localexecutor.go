// Package localexecutor is the harness's reference custom executor: the bash
// scripts in tests/runner/testdata/local-executor, which run each stage
// script on this host. Running it under the real runner proves the harness
// (fake GitLab, runner driver, helper) without the sandbox executor, so that a
// failure in the executor's own tests can be told from a harness failure.
package localexecutor

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/tests/runner"
)

// Executor is one test's instance of the local executor.
type Executor struct {
	Definition runner.CustomExecutor
	// Env must reach the executables, through the runner's environment. Its
	// PATH starts with HelperDir.
	Env []string
	// Dir holds the builds and caches (config_exec points builds_dir and
	// cache_dir into it).
	Dir string
	// HelperDir holds `gitlab-runner`, a link to the runner's helper binary
	// (runner.HelperPath), which the cache and artifacts stages call in the
	// job environment, here this host: as the sandbox executor's
	// helper_binary puts it into the pod.
	HelperDir  string
	eventsFile string
}

// ScriptsDir is the directory of the executor's scripts.
func ScriptsDir() string {
	_, thisFile, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(thisFile), "..", "testdata", "local-executor")
}

// New returns a local executor with a scratch directory of its own. Kill
// timeouts are short so that cancel tests stay fast. It fails the test if
// the runner's helper binary is missing.
func New(t testing.TB) *Executor {
	t.Helper()
	helper, err := runner.HelperPath()
	if err != nil {
		t.Fatal(err)
	}
	scripts := ScriptsDir()
	dir := t.TempDir()
	helperDir := filepath.Join(dir, "helper-bin")
	if err := os.Mkdir(helperDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(helper, filepath.Join(helperDir, "gitlab-runner")); err != nil {
		t.Fatal(err)
	}
	eventsFile := filepath.Join(dir, "events")
	return &Executor{
		Definition: runner.CustomExecutor{
			ConfigExec:          filepath.Join(scripts, "config.sh"),
			PrepareExec:         filepath.Join(scripts, "prepare.sh"),
			RunExec:             filepath.Join(scripts, "run.sh"),
			CleanupExec:         filepath.Join(scripts, "cleanup.sh"),
			GracefulKillTimeout: 5 * time.Second,
			ForceKillTimeout:    5 * time.Second,
		},
		Env: []string{"LOCAL_EXECUTOR_DIR=" + dir, "LOCAL_EXECUTOR_EVENTS=" + eventsFile,
			"PATH=" + helperDir + string(os.PathListSeparator) + os.Getenv("PATH")},
		Dir:        dir,
		HelperDir:  helperDir,
		eventsFile: eventsFile,
	}
}

// Events returns what the executables recorded, one call per entry:
// "config", "prepare job=... image=... response_file=... exit_code_file=...
// job_env=...", "run <stage> job_env=...", "cleanup job_env=...".
func (e *Executor) Events(t testing.TB) []string {
	t.Helper()
	data, err := os.ReadFile(e.eventsFile)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatalf("reading the local executor's events: %v", err)
	}
	return strings.Split(strings.TrimSpace(string(data)), "\n")
}

// Event returns the first event that starts with prefix, or "".
func (e *Executor) Event(t testing.TB, prefix string) string {
	t.Helper()
	for _, event := range e.Events(t) {
		if strings.HasPrefix(event, prefix) {
			return event
		}
	}
	return ""
}
