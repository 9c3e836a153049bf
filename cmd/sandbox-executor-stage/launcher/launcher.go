// Package launcher is the stage launcher: what the runner starts for prepare, run and cleanup
// when a stage server runs beside it. Starting sandbox-executor costs about 10 ms before its first line
// runs (Go's initialisation of client-go's API schemes and the rest of a 50 MB binary), on every
// stage, and a stage the server runs needs none of it. The launcher links only the config, the
// socket's protocol and the exit codes: it reads the config, hands the stage over and relays it.
// Whenever it cannot hand the stage over (no stage_server, nobody listening, a config it cannot
// read, a verb or flag it does not know), it becomes sandbox-executor with the same arguments
// and environment (execve), so the stage behaves, fails and warns exactly as without it.
package launcher

import (
	"context"
	"errors"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/gitlab"
	"github.com/sandbox-executor/sandbox-executor/internal/environ"
	"github.com/sandbox-executor/sandbox-executor/stageserver"
)

// Executor is the binary the launcher becomes when it does not hand the stage over: the one of
// this name next to it.
const Executor = "sandbox-executor"

// Main launches the stage and exits.
func Main() {
	started := time.Now()
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	exec := func(path string, argv, envv []string) error {
		// From here a SIGTERM ends the process, as it ends the executor's before that handles
		// signals. One that came before is the runner's cancel: the stage must not start.
		signal.Stop(signals)
		select {
		case <-signals:
			return errCancelled
		default:
		}
		return syscall.Exec(path, argv, envv)
	}
	os.Exit(Launch(context.Background(), Process{Args: os.Args, Environ: os.Environ(), Started: started,
		Stdout: os.Stdout, Stderr: os.Stderr, Signals: signals, Exec: exec}))
}

// errCancelled is the runner's cancel (SIGTERM) before the launcher became the executor.
var errCancelled = errors.New("cancelled")

// Process is the launcher's process as the runner started it, and how it becomes the executor.
type Process struct {
	Args, Environ  []string
	Started        time.Time
	Stdout, Stderr io.Writer
	// Signals are the runner's SIGTERM (cancel, timeout) and SIGINT: one cancels a stage handed
	// to the server.
	Signals <-chan os.Signal
	// Exec replaces the process (syscall.Exec); it returns only on failure.
	Exec func(path string, argv, envv []string) error
	// Self is the launcher's own path (os.Executable if empty): the executor is next to it.
	Self string
}

// Launch hands the stage to the stage server and returns its exit code, or becomes the executor.
func Launch(ctx context.Context, p Process) int {
	getenv := func(name string) string { return environ.Lookup(p.Environ, name) }
	report := gitlab.RunnerEnvFrom(getenv).Report
	if len(p.Args) == 0 {
		p.Args = []string{Executor}
	}
	socket, stage, ok := served(p.Args[1:], getenv)
	if !ok {
		return p.becomeExecutor(report)
	}
	stage.Environ, stage.Started = p.Environ, p.Started
	code, err := p.hand(ctx, socket, stage)
	if stageserver.NotServed(err) {
		// The executor tries the server again and says in the job log why it runs the stage.
		return p.becomeExecutor(report)
	}
	if err != nil {
		return report(p.Stderr, err)
	}
	return code
}

// hand hands the stage to the server (stageserver.Hand), cancelling it on a signal.
func (p Process) hand(ctx context.Context, socket string, stage stageserver.Stage) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	handed, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-p.Signals:
			cancel()
		case <-handed:
		}
	}()
	defer func() { close(handed); <-watched }()
	return stageserver.Hand(ctx, socket, stage, p.Stdout, p.Stderr)
}

// served reads the command line the runner gave ([--config PATH] STAGE, or [--config PATH] run
// SCRIPT NAME) and the config it names,
// and returns the stage server's socket and the stage to hand it; ok is false for anything else,
// which the executor handles as it always does (its usage errors, its config errors).
//
// It reads the arguments by hand instead of through urfave/cli like the other binaries: it must
// recognise only the shapes it can hand over and pass every other command line, unknown flags
// included, to the executor unchanged, where a parser would refuse them itself.
func served(args []string, getenv func(string) string) (socket string, stage stageserver.Stage, ok bool) {
	var configFlag string
	for len(args) > 0 && strings.HasPrefix(args[0], "-") {
		// -config and --config, with the value after = or as the next argument, as the
		// executor's flags take them; anything else is the executor's to parse.
		name, value, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(args[0], "-"), "-"), "=")
		if name != "config" {
			return "", stage, false
		}
		if !hasValue {
			if len(args) < 2 {
				return "", stage, false
			}
			value, args = args[1], args[1:]
		}
		configFlag, args = value, args[1:]
	}
	if len(args) == 0 || !stageserver.Serves(args[0]) || len(args) != 1+stageserver.Arguments(args[0]) {
		return "", stage, false
	}
	stageArgs := args[1:]
	if args[0] == "run" {
		// The script's path as the server, in its own working directory, finds it.
		script, err := filepath.Abs(args[1])
		if err != nil {
			return "", stage, false
		}
		stageArgs = []string{script, args[2]}
	}
	cfg, err := config.Load(config.ResolvePath(configFlag, getenv))
	if err != nil || cfg.StageServer == "" {
		return "", stage, false
	}
	path, err := filepath.Abs(cfg.Path())
	if err != nil {
		return "", stage, false
	}
	return cfg.StageServer, stageserver.Stage{Config: path, Name: args[0], Args: stageArgs}, true
}

// becomeExecutor execs sandbox-executor with the launcher's arguments and environment, and
// returns only if it cannot: a broken install, which retrying does not mend.
func (p Process) becomeExecutor(report func(io.Writer, error) int) int {
	self := p.Self
	if self == "" {
		var err error
		if self, err = os.Executable(); err != nil {
			return report(p.Stderr, failure.PermanentError(err, "the stage launcher cannot find itself"))
		}
	}
	executor := filepath.Join(filepath.Dir(self), Executor)
	err := p.Exec(executor, append([]string{executor}, p.Args[1:]...), p.Environ)
	switch {
	case errors.Is(err, errCancelled):
		return report(p.Stderr, failure.SystemError(nil, "the stage was cancelled before it started"))
	case errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.EACCES), errors.Is(err, syscall.ENOEXEC), errors.Is(err, syscall.ENOTDIR):
		// A broken install: retrying does not mend it.
		return report(p.Stderr, failure.PermanentError(nil, "the stage launcher cannot start %s: %v (install %s next to %s)", executor, err, Executor, filepath.Base(self)))
	}
	// Anything else may pass (a binary being replaced, memory): the runner retries.
	return report(p.Stderr, failure.SystemError(nil, "the stage launcher cannot start %s: %v", executor, err))
}
