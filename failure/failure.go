// Package failure classifies what went wrong the way the runner must treat it: a system failure
// (retried), the job's own failure, or a permanent one (not retried). gitlab/exit.go maps a Kind
// to the runner's exit code in one place (gitlab.RunnerEnv.ExitCode), for every binary the runner
// starts.
package failure

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// Kind says how the runner must treat a failure. The CLI maps it to an exit code in one place.
type Kind int

const (
	// KindSystem is an infrastructure failure worth retrying: API unreachable, pod gone,
	// stream broken. Exits SYSTEM_FAILURE_EXIT_CODE.
	KindSystem Kind = iota
	// KindBuild is the job's own script failing. Exits BUILD_FAILURE_EXIT_CODE with the
	// script's code in BUILD_EXIT_CODE_FILE.
	KindBuild
	// KindPermanent is a failure no retry can fix (bad config, image not allowed, missing CRDs,
	// RBAC denied). Exits BUILD_FAILURE_EXIT_CODE so the runner does not retry prepare 3 times.
	KindPermanent
)

// Error is a classified failure with a one-line, actionable message.
type Error struct {
	Kind Kind
	// ExitCode is the script's exit code, for KindBuild.
	ExitCode int
	Msg      string
	Err      error
}

func (e *Error) Error() string {
	if e.Err == nil {
		return e.Msg
	}
	if e.Msg == "" {
		return e.Err.Error()
	}
	return e.Msg + ": " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// SystemError wraps a transient infrastructure failure.
func SystemError(err error, format string, args ...any) error {
	return &Error{Kind: KindSystem, Msg: fmt.Sprintf(format, args...), Err: err}
}

// PermanentError wraps a failure that retrying cannot fix.
func PermanentError(err error, format string, args ...any) error {
	return &Error{Kind: KindPermanent, Msg: fmt.Sprintf(format, args...), Err: err}
}

// BuildError reports a script that exited with a non-zero code.
func BuildError(code int) error {
	return &Error{Kind: KindBuild, ExitCode: code, Msg: fmt.Sprintf("script exited with code %d", code)}
}

// KindOf classifies err; unclassified errors are system failures, because a failure we did not
// anticipate must never pass for the job's own.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return KindSystem
}

// OneLine cuts s at its first line break: error text lands in job logs, one line per failure.
func OneLine(s string) string {
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		return s[:i]
	}
	return s
}

// WithoutPath is an *os.PathError's cause alone ("no such file or directory"), for messages
// that name the file themselves.
func WithoutPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// Line is err as the one line a job log shows: an error that adds no message of its own shows
// its cause's.
func Line(err error) string {
	msg := err.Error()
	var ee *Error
	if errors.As(err, &ee) && ee.Msg == "" && ee.Err != nil {
		msg = ee.Err.Error()
	}
	return OneLine(strings.TrimSuffix(msg, ": "))
}
