// Package executor is the core of sandbox-executor: it maps a GitLab job onto a SandboxClaim,
// runs stage scripts in the claimed pod, and releases the claim. The stages packages and the CLI
// are thin layers over it.
package executor

import (
	"errors"
	"fmt"
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
