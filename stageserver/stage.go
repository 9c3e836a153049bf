package stageserver

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/sandbox-executor/sandbox-executor/buildinfo"
	"github.com/sandbox-executor/sandbox-executor/failure"
)

// Serves says whether stage may go through the stage server: prepare and cleanup, which talk to
// the API server, where a warm connection saves most, and run, which saves the executor's start
// (about 10 ms of Go initialisation per stage) when the stage launcher hands it over.
func Serves(stage string) bool { return stage == "prepare" || stage == "cleanup" || stage == "run" }

// Arguments is how many arguments stage takes after its name: run takes its script and the
// runner's stage name, prepare and cleanup none.
func Arguments(stage string) int {
	if stage == "run" {
		return 2
	}
	return 0
}

// Stage is a stage to hand to the server, as the runner started it.
type Stage struct {
	// Config is the executor config's absolute path: the server has its own working directory.
	Config string
	// Name is the verb (prepare, run, cleanup) and Args its arguments (run's script, an absolute
	// path, and the runner's stage name).
	Name string
	Args []string
	// Environ is the stage's whole environment; Started, when its process started.
	Environ []string
	Started time.Time
}

// Hand has the server at socket run the stage, relays its output, and returns its exit code, or
// the failure that ends the stage. For an error that NotServed reports, nothing ran and nothing
// cancelled the stage: the caller runs it itself. Every other error is a system failure, which
// the runner retries: a stage cancelled before a server took it, or a server lost mid-stage (what the stage did there is
// unknown; prepare and cleanup are idempotent, and a run stage's script is stopped by the
// server when its client goes, as the runner's cancel stops it).
func Hand(ctx context.Context, socket string, s Stage, stdout, stderr io.Writer) (int, error) {
	args := append([]string{"sandbox-executor", "--config", s.Config, s.Name}, s.Args...)
	req := Request{Args: args, Environ: s.Environ, Started: s.Started, Version: buildinfo.Version}
	code, err := forward(ctx, socket, req, stdout, stderr)
	switch {
	case err == nil:
		return code, nil
	case ctx.Err() != nil && (NotServed(err) || errors.Is(err, context.Canceled)):
		// The runner cancelled the stage before a server took it: it must not start here either.
		return 0, failure.SystemError(err, "%s cancelled before it started", s.Name)
	case NotServed(err):
		return 0, err
	default:
		return 0, failure.SystemError(err, "stage server %s", socket)
	}
}
