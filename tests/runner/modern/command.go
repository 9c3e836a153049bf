package modern

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"
)

// The exit codes the runner announces to every executable.
const (
	BuildFailureExitCode  = 1
	SystemFailureExitCode = 2
)

// BuildError is a failure the runner blames on the job rather than on the
// executor (the runner's common.BuildError): it is never retried.
type BuildError struct {
	// Reason is the failure_reason GitLab gets: script_failure,
	// runner_configuration_error, job_canceled or job_execution_timeout.
	Reason string
	// ExitCode is the job's exit code, from BUILD_EXIT_CODE_FILE for a
	// failed script.
	ExitCode int
	Err      error
}

func (e *BuildError) Error() string { return e.Err.Error() }
func (e *BuildError) Unwrap() error { return e.Err }

// SystemFailureError is an executable that exited with
// SYSTEM_FAILURE_EXIT_CODE, with a code the protocol does not define, or on
// a signal: the runner reports runner_system_failure and retries
// preparation.
type SystemFailureError struct {
	ExitCode int // -1 for a signal
	Err      error
}

func (e *SystemFailureError) Error() string {
	if e.ExitCode == SystemFailureExitCode {
		return e.Err.Error()
	}
	return fmt.Sprintf("unknown Custom executor executable exit code %d; executable execution terminated with: %v", e.ExitCode, e.Err)
}
func (e *SystemFailureError) Unwrap() error { return e.Err }

// Failure reasons the driver reports.
const (
	ReasonScriptFailure       = "script_failure"
	ReasonSystemFailure       = "runner_system_failure"
	ReasonConfigurationError  = "runner_configuration_error"
	ReasonJobCanceled         = "job_canceled"
	ReasonJobExecutionTimeout = "job_execution_timeout"
)

// invocation is one call of a custom executor executable.
type invocation struct {
	executable string
	args       []string
	dir        string
	env        []string
	stdout     io.Writer
	stderr     io.Writer

	gracefulKillTimeout time.Duration
	forceKillTimeout    time.Duration
	buildExitCodeFile   string
}

// run runs the executable like the runner's executors/custom/command: in a
// process group of its own, and on ctx's end SIGTERM to that group, SIGKILL
// after the graceful timeout, abandoned after the force timeout. The exit
// code is interpreted by the protocol's rules. exitCode is -1 for a signal
// or a process that did not start.
func (inv invocation) run(ctx context.Context) (exitCode int, err error) {
	cmd := exec.Command(inv.executable, inv.args...)
	cmd.Dir = inv.dir
	cmd.Env = inv.env
	cmd.Stdout = inv.stdout
	cmd.Stderr = inv.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("failed to start command: %w", err)
	}

	type exit struct {
		code int
		err  error
	}
	exited := make(chan exit, 1)
	go func() {
		waitErr := cmd.Wait()
		code, err := inv.interpret(waitErr)
		exited <- exit{code, err}
	}()

	select {
	case result := <-exited:
		return result.code, result.err
	case <-ctx.Done():
	}

	processGroup := -cmd.Process.Pid
	_ = syscall.Kill(processGroup, syscall.SIGTERM)
	select {
	case result := <-exited:
		return result.code, result.err
	case <-time.After(inv.gracefulKillTimeout):
	}
	_ = syscall.Kill(processGroup, syscall.SIGKILL)
	select {
	case result := <-exited:
		return result.code, result.err
	case <-time.After(inv.forceKillTimeout):
		return -1, &SystemFailureError{ExitCode: -1,
			Err: fmt.Errorf("failed to kill process PID=%d, likely process is dormant", cmd.Process.Pid)}
	}
}

// interpret applies the protocol to how the process ended: 0 is success,
// BUILD_FAILURE_EXIT_CODE a failed script whose own code is the first line
// of BUILD_EXIT_CODE_FILE, anything else a system failure.
func (inv invocation) interpret(waitErr error) (int, error) {
	var exitError *exec.ExitError
	if !errors.As(waitErr, &exitError) {
		if waitErr != nil {
			return -1, &SystemFailureError{ExitCode: -1, Err: waitErr}
		}
		return 0, nil
	}
	code := exitError.ExitCode()
	if code == BuildFailureExitCode {
		return code, inv.readBuildExitCode(exitError)
	}
	return code, &SystemFailureError{ExitCode: code, Err: exitError}
}

// readBuildExitCode reads the job's exit code as command.parseBuildFailure
// does: no file means exit code 1; a first line that is no integer is a
// system failure.
func (inv invocation) readBuildExitCode(exitError *exec.ExitError) error {
	file, err := os.Open(inv.buildExitCodeFile)
	if err != nil {
		return &BuildError{Reason: ReasonScriptFailure, ExitCode: BuildFailureExitCode, Err: exitError}
	}
	defer file.Close()

	scanner := bufio.NewScanner(file)
	firstLine := ""
	if scanner.Scan() {
		firstLine = scanner.Text()
	}
	exitCode, err := strconv.Atoi(firstLine)
	if err != nil {
		return &SystemFailureError{ExitCode: SystemFailureExitCode,
			Err: fmt.Errorf("%w; BUILD_EXIT_CODE_FILE holds %q, not an exit code", exitError, firstLine)}
	}
	return &BuildError{Reason: ReasonScriptFailure, ExitCode: exitCode, Err: fmt.Errorf("exit status %d", exitCode)}
}
