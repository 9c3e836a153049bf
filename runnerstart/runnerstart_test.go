package runnerstart_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
	"k8s.io/apimachinery/pkg/util/wait"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
	"github.com/sandbox-executor/sandbox-executor/runnerstart"
)

// fakeRunner is a gitlab-runner that records each call (its arguments and whether it saw the
// token), fails register until the marker file fail-left counts down to zero, and for run waits
// for SIGQUIT when told to.
const fakeRunner = `#!/bin/sh
dir=$(dirname "$0")
echo "$1 token=${CI_SERVER_TOKEN:-none}" >>"$dir/calls"
case $1 in
register)
  left=$(cat "$dir/fail-left")
  if [ "$left" -gt 0 ]; then echo $((left - 1)) >"$dir/fail-left"; exit 1; fi
  echo '[[runners]]' >>"$4"
  ;;
run)
  cp "$3" "$dir/run-config"
  if [ -f "$dir/wait-quit" ]; then
    trap 'echo quit >>"$dir/calls"; exit 0' QUIT
    echo started >"$dir/run-started"
    while :; do sleep 1; done
  fi
  ;;
esac
`

type fixture struct {
	dir   string
	opts  runnerstart.Options
	clock *clocktesting.FakeClock
}

func newFixture(t *testing.T, registerFailures int) *fixture {
	t.Helper()
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("gitlab-runner", fakeRunner, 0o755)
	write("fail-left", strconv.Itoa(registerFailures), 0o644)
	write("global.toml", "concurrent = 8\n", 0o644)
	write("template.toml", "[[runners]]\n", 0o644)
	clock := clocktesting.NewFakeClock(time.Unix(0, 0))
	return &fixture{dir: dir, clock: clock, opts: runnerstart.Options{
		GitLabRunner:     filepath.Join(dir, "gitlab-runner"),
		GlobalConfig:     filepath.Join(dir, "global.toml"),
		Template:         filepath.Join(dir, "template.toml"),
		ConfigFile:       filepath.Join(dir, "home", ".gitlab-runner", "config.toml"),
		WorkingDirectory: dir,
		Backoff:          wait.Backoff{Duration: time.Second, Factor: 2, Steps: 4},
		Clock:            clock,
		Environ:          []string{"PATH=/usr/bin:/bin", runnerstart.TokenEnv + "=glrt-secret"},
		Stdout:           &testutil.LockedBuffer{},
		Stderr:           &testutil.LockedBuffer{},
	}}
}

func (f *fixture) calls(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.dir, "calls"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// runAdvancing runs Run, moving the fake clock on whenever Run waits for its next attempt.
func (f *fixture) runAdvancing(t *testing.T, ctx context.Context) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- runnerstart.Run(ctx, f.opts) }()
	for {
		select {
		case err := <-done:
			return err
		default:
		}
		if f.clock.HasWaiters() {
			f.clock.Step(time.Hour)
			continue
		}
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func TestRegisterRetriesThenRunsWithoutToken(t *testing.T) {
	f := newFixture(t, 2)
	if err := f.runAdvancing(t, context.Background()); err != nil {
		t.Fatalf("Run: %v\nstderr: %s", err, f.opts.Stderr)
	}
	want := []string{"register token=glrt-secret", "register token=glrt-secret", "register token=glrt-secret", "run token=none"}
	if got := f.calls(t); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("calls %q, want %q", got, want)
	}
	// Each attempt starts from the global section: the config run gets has exactly one entry.
	cfg, err := os.ReadFile(filepath.Join(f.dir, "run-config"))
	if err != nil {
		t.Fatal(err)
	}
	if string(cfg) != "concurrent = 8\n[[runners]]\n" {
		t.Errorf("config.toml given to run:\n%s", cfg)
	}
	stderr := f.opts.Stderr.(*testutil.LockedBuffer).String()
	if !strings.Contains(stderr, "attempt 2 of 4") || strings.Contains(stderr, "glrt-secret") {
		t.Errorf("stderr should report the retries without the token:\n%s", stderr)
	}
}

func TestRegisterGivesUpAfterItsAttempts(t *testing.T) {
	f := newFixture(t, 9)
	err := f.runAdvancing(t, context.Background())
	if err == nil || !strings.Contains(err.Error(), "register failed 4 times, giving up") {
		t.Fatalf("Run: %v, want it to give up after 4 attempts", err)
	}
	if got := f.calls(t); len(got) != 4 {
		t.Errorf("calls %q, want 4 registers and no run", got)
	}
}

func TestNoTokenIsAOneLineError(t *testing.T) {
	f := newFixture(t, 0)
	f.opts.Environ = []string{"PATH=/usr/bin:/bin"}
	err := runnerstart.Run(context.Background(), f.opts)
	if err == nil || err.Error() != "start-runner: CI_SERVER_TOKEN is empty: mount the runner authentication token from the Secret's key runner-token" {
		t.Fatalf("Run: %v", err)
	}
}

// The pod's SIGTERM (ctx cancelled) reaches gitlab-runner as SIGQUIT, its graceful stop.
func TestStopIsGraceful(t *testing.T) {
	f := newFixture(t, 0)
	if err := os.WriteFile(filepath.Join(f.dir, "wait-quit"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runnerstart.Run(ctx, f.opts) }()
	started := filepath.Join(f.dir, "run-started")
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		_, err := os.Stat(started)
		return err == nil, nil
	}); err != nil {
		t.Fatal("gitlab-runner run never started")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := f.calls(t); got[len(got)-1] != "quit" {
		t.Errorf("calls %q: gitlab-runner did not get SIGQUIT", got)
	}
}

// The stage server listens before gitlab-runner runs (no job's stage finds it missing) and stops
// only after gitlab-runner has exited (the jobs a graceful stop lets finish still use it).
func TestStageServerOutlivesGitLabRunner(t *testing.T) {
	f := newFixture(t, 0)
	record := func(line string) {
		calls, err := os.OpenFile(filepath.Join(f.dir, "calls"), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			t.Error(err)
			return
		}
		defer calls.Close()
		calls.WriteString(line + "\n")
	}
	f.opts.StageServer = func() (func(context.Context) error, error) {
		record("listen")
		return func(ctx context.Context) error {
			<-ctx.Done()
			record("serve stopped")
			return nil
		}, nil
	}
	if err := runnerstart.Run(context.Background(), f.opts); err != nil {
		t.Fatalf("Run: %v", err)
	}
	want := []string{"register token=glrt-secret", "listen", "run token=none", "serve stopped"}
	if got := f.calls(t); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("calls %q, want %q", got, want)
	}

	f = newFixture(t, 0)
	f.opts.StageServer = func() (func(context.Context) error, error) {
		return nil, errors.New("stage server socket /x: another server is listening on it")
	}
	if err := runnerstart.Run(context.Background(), f.opts); err == nil || !strings.Contains(err.Error(), "another server is listening") {
		t.Errorf("Run with a stage server that cannot listen: %v", err)
	}
	if got := f.calls(t); slices.Contains(got, "run token=none") {
		t.Errorf("gitlab-runner ran without its stage server: %q", got)
	}
}

// Flags after an argument are not parsed (`start-runner start-runner --stage-server ...`, the
// verb given again after the image's entrypoint): refused in one line, never run without them.
func TestArgumentsAreRefused(t *testing.T) {
	var stderr testutil.LockedBuffer
	app := &cli.App{Commands: []*cli.Command{runnerstart.Command(&stderr, &stderr, nil)}, ExitErrHandler: func(*cli.Context, error) {}}
	err := app.Run([]string{"sandbox-executor", "start-runner", "start-runner", "--stage-server", "/run/s.sock"})
	if err == nil || !strings.Contains(err.Error(), `start-runner takes no arguments, got ["start-runner" "--stage-server" "/run/s.sock"]`) {
		t.Errorf("start-runner with arguments: %v", err)
	}
}
