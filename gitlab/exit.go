package gitlab

import (
	"fmt"
	"io"

	"github.com/sandbox-executor/sandbox-executor/failure"
)

// ExitCode maps a stage's outcome onto the runner's protocol: script failures and permanent
// errors are build failures (not retried), everything else is a system failure (retried).
func (e RunnerEnv) ExitCode(err error) int {
	if err == nil {
		return 0
	}
	switch failure.KindOf(err) {
	case failure.KindBuild, failure.KindPermanent:
		return e.BuildFailureExitCode
	default:
		return e.SystemFailureExitCode
	}
}

// Report ends a stage: it prints err on stderr in one line for the job log (a failed script has
// said its own piece) and returns the stage's exit code. Every binary the runner starts for a
// stage ends here, so that a failure maps to the same exit code whichever ran it.
func (e RunnerEnv) Report(stderr io.Writer, err error) int {
	if err != nil && failure.KindOf(err) != failure.KindBuild {
		fmt.Fprintf(stderr, "sandbox-executor: ERROR: %s\n", failure.Line(err))
	}
	return e.ExitCode(err)
}
