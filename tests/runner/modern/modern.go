// Package modern invokes a custom executor's executables exactly as
// gitlab-runner 17.x does (read from the runner's source; see
// shared/notes/runner-protocol.md), without a runner binary: the newest
// runner that can be built here is 12.8, which predates much of the protocol.
//
// Per job it writes the job JSON to JOB_RESPONSE_FILE, calls config_exec and
// parses its JSON, calls prepare_exec, then run_exec once per stage with a
// generated bash script (0700, starting with `trap exit 1 TERM`) and the
// stage name, and always cleanup_exec. Every call gets the runner's
// environment plus TMPDIR, BUILD_FAILURE_EXIT_CODE, SYSTEM_FAILURE_EXIT_CODE,
// BUILD_EXIT_CODE_FILE, JOB_RESPONSE_FILE, config_exec's job_env and
// CUSTOM_ENV_<KEY> for every job variable. Exit codes, preparation retries,
// cancellation (SIGTERM to the process group, then SIGKILL) and the job's
// outcome follow the runner.
package modern

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandbox-executor/sandbox-executor/internal/testutil"
	"github.com/sandbox-executor/sandbox-executor/tests/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/runner"
)

// Config is the runner side of a job: its [[runners]] entry.
type Config struct {
	Executor runner.CustomExecutor
	// BuildsDir and CacheDir are builds_dir and cache_dir, paths inside the
	// job environment; config_exec may override them, and the job fails if
	// neither sets them.
	BuildsDir string
	CacheDir  string
	// URL is GitLab's URL as the runner knows it, which the artifact stages
	// pass to `gitlab-runner artifacts-*`; empty means the job's CI_SERVER_URL.
	URL string
	// Token is the runner token; jobs only see its short form
	// (CI_RUNNER_SHORT_TOKEN). Empty means a fixed placeholder.
	Token string
	// Environment is [[runners]] environment: KEY=VALUE variables added to
	// every job.
	Environment []string
	// ProcessEnv is the runner process's own environment, which every
	// executable inherits; nil means this process's environment.
	ProcessEnv []string
	// RunnerCommand is what the cache and artifact stages call inside the job
	// environment; empty means "gitlab-runner".
	RunnerCommand string
	// TempDir is where the per-job custom-executor* directory is made; empty
	// means the system default.
	TempDir string
	// PreparationRetryInterval is the pause between preparation attempts:
	// 0 means the runner's 3 s, negative means none.
	PreparationRetryInterval time.Duration
	// LogOutput, if set, also receives the job log as it is written.
	LogOutput io.Writer
}

const (
	defaultRunnerToken         = "glrt-modern-driver-token"
	defaultRunnerCommand       = "gitlab-runner"
	defaultRetryInterval       = 3 * time.Second
	preparationAttempts        = 3
	defaultJobTimeout          = 2 * time.Hour
	afterScriptTimeout         = 5 * time.Minute
	maxStageAttempts           = 10
	responseFileName           = "response.json"
	buildExitCodeFileName      = "build_exit_code"
	customExecutorTempPrefix   = "custom-executor"
	stageScriptDirectoryPrefix = "script"

	// stateTimedOut is CI_JOB_STATUS in after_script after a job timeout; the
	// other values are GitLab's job states.
	stateTimedOut = "timedout"
)

func (c Config) withDefaults() (Config, error) {
	if c.Executor.RunExec == "" {
		return c, errors.New("modern: Executor.RunExec is required")
	}
	if c.Token == "" {
		c.Token = defaultRunnerToken
	}
	if c.RunnerCommand == "" {
		c.RunnerCommand = defaultRunnerCommand
	}
	if c.ProcessEnv == nil {
		c.ProcessEnv = os.Environ()
	}
	if c.PreparationRetryInterval == 0 {
		c.PreparationRetryInterval = defaultRetryInterval
	}
	return c, nil
}

// Executable names in Call.Executable.
const (
	ExecutableConfig  = "config"
	ExecutablePrepare = "prepare"
	ExecutableRun     = "run"
	ExecutableCleanup = "cleanup"
)

// Call is one invocation of an executor executable.
type Call struct {
	Executable string // config, prepare, run or cleanup
	// Stage is the stage name run_exec got (build_script for step_script).
	Stage string
	Args  []string
	// Attempt is the preparation attempt (1-3) the call belongs to.
	Attempt  int
	ExitCode int // -1 for a signal or a process that did not start
	Err      error
	Started  time.Time
	Duration time.Duration
}

// Result is how the job ended, as the runner would report it to GitLab.
type Result struct {
	// State is success or failed.
	State string
	// FailureReason is empty on success, else script_failure,
	// runner_system_failure, runner_configuration_error, job_canceled or
	// job_execution_timeout.
	FailureReason string
	// ExitCode is the failed script's exit code (from BUILD_EXIT_CODE_FILE);
	// 0 on success and for the other failures.
	ExitCode int
	// Err is why the job failed.
	Err   error
	Calls []Call
	// Log is the job log, what the runner would send to GitLab as the trace:
	// its own messages, config_exec's stderr and the stdout and stderr of
	// prepare_exec and run_exec, with masked variables hidden.
	Log string
	// CleanupLog is cleanup_exec's output, which goes to the runner's own
	// log and never to the job log.
	CleanupLog string
	// ConfigOutput is what config_exec returned in the last attempt.
	ConfigOutput *ConfigExecOutput
	Duration     time.Duration
}

// Stages lists the stage names run_exec was called with, in order.
func (r *Result) Stages() []string {
	var stages []string
	for _, call := range r.Calls {
		if call.Executable == ExecutableRun {
			stages = append(stages, call.Stage)
		}
	}
	return stages
}

// ConfigExecOutput is the JSON config_exec prints (executors/custom/api).
type ConfigExecOutput struct {
	Driver            *DriverInfo        `json:"driver,omitempty"`
	Hostname          *string            `json:"hostname,omitempty"`
	BuildsDir         *string            `json:"builds_dir,omitempty"`
	CacheDir          *string            `json:"cache_dir,omitempty"`
	BuildsDirIsShared *bool              `json:"builds_dir_is_shared,omitempty"`
	JobEnv            *map[string]string `json:"job_env,omitempty"`
	Shell             *string            `json:"shell,omitempty"`
}

// DriverInfo names the executor in the job log.
type DriverInfo struct {
	Name    *string `json:"name,omitempty"`
	Version *string `json:"version,omitempty"`
}

// Run runs job through the executor and returns its outcome. Canceling ctx
// is GitLab canceling the job: the running executable gets SIGTERM (then
// SIGKILL), no further stage runs, cleanup_exec still does. The job's
// runner_info.timeout bounds it like the runner's job timeout. The error is
// only for a driver that could not run the job at all.
func Run(ctx context.Context, config Config, job fakegitlab.Job) (*Result, error) {
	config, err := config.withDefaults()
	if err != nil {
		return nil, err
	}
	d := &driver{
		config:     config,
		job:        job,
		log:        newJobLog(maskedValues(job), config.LogOutput),
		cleanupLog: &testutil.LockedBuffer{},
		result:     &Result{},
	}
	started := time.Now()
	jobCtx, cancel := context.WithTimeout(ctx, jobTimeout(job))
	defer cancel()

	d.log.printf("Running with the modern custom executor driver (gitlab-runner %s protocol)\n", ImitatedRunnerVersion)
	d.log.printf("%sPreparing the \"custom\" executor%s\n", ansiBoldCyan, ansiReset)
	instance, err := d.prepareExecutor(jobCtx)
	if err == nil {
		err = d.executeScript(jobCtx, instance)
		// The runner cleans up before it reports the job's final state, so
		// cleanup_exec counts in the job's duration as GitLab sees it.
		d.cleanup(instance)
	}
	d.finish(abortedJobError(ctx, jobCtx, job, err), time.Since(started))
	return d.result, nil
}

func jobTimeout(job fakegitlab.Job) time.Duration {
	if job.RunnerInfo.Timeout <= 0 {
		return defaultJobTimeout
	}
	return time.Duration(job.RunnerInfo.Timeout) * time.Second
}

// abortedJobError replaces err when the job was canceled (ctx ended) or
// timed out (only jobCtx ended), as Build.run does.
func abortedJobError(ctx, jobCtx context.Context, job fakegitlab.Job, err error) error {
	switch {
	case ctx.Err() != nil:
		return &BuildError{Reason: ReasonJobCanceled, Err: errors.New("canceled")}
	case errors.Is(jobCtx.Err(), context.DeadlineExceeded):
		return &BuildError{Reason: ReasonJobExecutionTimeout,
			Err: fmt.Errorf("execution took longer than %v seconds", jobTimeout(job))}
	default:
		return err
	}
}

type driver struct {
	config     Config
	job        fakegitlab.Job
	log        *jobLog
	cleanupLog *testutil.LockedBuffer
	result     *Result

	// Known once config_exec has answered.
	dirs     buildDirs
	hostname string
	// jobStatus is CI_JOB_STATUS for after_script; empty means "running".
	jobStatus string
}

// executorInstance is one preparation attempt's executor: the runner makes a
// new one, with a new temporary directory, for every attempt.
type executorInstance struct {
	attempt           int
	tempDir           string
	jobResponseFile   string
	buildExitCodeFile string
	jobEnv            map[string]string
}

// prepareExecutor is Build.retryCreateExecutor: up to 3 attempts of
// config_exec + prepare_exec, each failed one cleaned up; a BuildError is not
// retried.
func (d *driver) prepareExecutor(ctx context.Context) (*executorInstance, error) {
	var err error
	for attempt := 1; attempt <= preparationAttempts; attempt++ {
		var instance *executorInstance
		instance, err = d.prepareAttempt(ctx, attempt)
		if err == nil {
			return instance, nil
		}
		if instance != nil {
			d.cleanup(instance)
		}
		var buildError *BuildError
		if errors.As(err, &buildError) || ctx.Err() != nil {
			return nil, err
		}
		d.log.printf("%sWARNING: Preparation failed: %v%s\n", ansiYellow, err, ansiReset)
		// Like the runner, this waits after the last attempt too.
		interval := max(0, d.config.PreparationRetryInterval)
		d.log.printf("Will be retried in %v ...\n", interval)
		select {
		case <-time.After(interval):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return nil, err
}

func (d *driver) prepareAttempt(ctx context.Context, attempt int) (*executorInstance, error) {
	tempDir, err := os.MkdirTemp(d.config.TempDir, customExecutorTempPrefix)
	if err != nil {
		return nil, err
	}
	instance := &executorInstance{
		attempt:           attempt,
		tempDir:           tempDir,
		jobResponseFile:   filepath.Join(tempDir, responseFileName),
		buildExitCodeFile: filepath.Join(tempDir, buildExitCodeFileName),
	}
	if err := writeJobResponse(instance.jobResponseFile, d.job); err != nil {
		return instance, err
	}

	configOutput, err := d.runConfigExec(ctx, instance)
	if err != nil {
		return instance, err
	}
	d.result.ConfigOutput = configOutput
	d.logStartupMessage(configOutput)
	if err := d.startBuild(configOutput); err != nil {
		return instance, err
	}
	if configOutput.JobEnv != nil {
		instance.jobEnv = *configOutput.JobEnv
	}

	executor := d.config.Executor
	if executor.PrepareExec == "" {
		return instance, nil
	}
	prepareCtx, cancel := context.WithTimeout(ctx, executor.EffectiveTimeouts().PrepareExec)
	defer cancel()
	return instance, d.call(prepareCtx, instance, Call{Executable: ExecutablePrepare, Args: executor.PrepareArgs},
		executor.PrepareExec, d.log, d.log)
}

func writeJobResponse(file string, job fakegitlab.Job) error {
	var encoded bytes.Buffer
	if err := json.NewEncoder(&encoded).Encode(job); err != nil {
		return fmt.Errorf("encoding job response file: %w", err)
	}
	return os.WriteFile(file, encoded.Bytes(), 0o600)
}

// runConfigExec calls config_exec; its stdout is the JSON answer, its
// stderr goes to the job log. No output means no overrides.
func (d *driver) runConfigExec(ctx context.Context, instance *executorInstance) (*ConfigExecOutput, error) {
	executor := d.config.Executor
	output := &ConfigExecOutput{}
	if executor.ConfigExec == "" {
		return output, nil
	}
	configCtx, cancel := context.WithTimeout(ctx, executor.EffectiveTimeouts().ConfigExec)
	defer cancel()
	var stdout testutil.LockedBuffer
	err := d.call(configCtx, instance, Call{Executable: ExecutableConfig, Args: executor.ConfigArgs},
		executor.ConfigExec, &stdout, d.log)
	if err != nil {
		return nil, err
	}
	answer := stdout.Bytes()
	if len(answer) == 0 {
		return output, nil
	}
	if err := json.Unmarshal(answer, output); err != nil {
		return nil, fmt.Errorf("error while parsing JSON output: %w", err)
	}
	return output, nil
}

func (d *driver) logStartupMessage(output *ConfigExecOutput) {
	const usage = "Using Custom executor"
	driver := output.Driver
	switch {
	case driver == nil || driver.Name == nil:
		d.log.printf("%s...\n", usage)
	case driver.Version == nil:
		d.log.printf("%s with driver %s...\n", usage, *driver.Name)
	default:
		d.log.printf("%s with driver %s %s...\n", usage, *driver.Name, *driver.Version)
	}
}

// startBuild is Build.StartBuild: builds_dir and cache_dir are now final.
func (d *driver) startBuild(output *ConfigExecOutput) error {
	buildsDir, cacheDir, shared := d.config.BuildsDir, d.config.CacheDir, false
	if output.BuildsDir != nil {
		buildsDir = *output.BuildsDir
	}
	if output.CacheDir != nil {
		cacheDir = *output.CacheDir
	}
	if output.BuildsDirIsShared != nil {
		shared = *output.BuildsDirIsShared
	}
	if output.Hostname != nil {
		d.hostname = *output.Hostname
	}
	if output.Shell != nil && *output.Shell != "bash" {
		return &BuildError{Reason: ReasonConfigurationError,
			Err: fmt.Errorf("shell %q from config_exec: the modern driver only generates bash scripts", *output.Shell)}
	}
	if buildsDir == "" {
		return &BuildError{Reason: ReasonConfigurationError, Err: errors.New("the builds_dir is not configured")}
	}
	if cacheDir == "" {
		return &BuildError{Reason: ReasonConfigurationError, Err: errors.New("the cache_dir is not configured")}
	}
	strategy := gitStrategy(d.job, d.allVariables())
	d.dirs = buildDirs{
		builds:          buildsDir,
		cache:           cacheDir,
		project:         path.Join(buildsDir, projectUniqueDir(d.job, d.config.Token, shared, strategy)),
		projectCache:    path.Join(cacheDir, projectUniqueDir(d.job, d.config.Token, false, strategy)),
		sharedBuildsDir: shared,
	}
	return nil
}

// executeScript is Build.executeScript: the stages in the runner's order.
func (d *driver) executeScript(ctx context.Context, instance *executorInstance) error {
	if err := d.runStage(ctx, instance, StagePrepareScript); err != nil {
		return fmt.Errorf("prepare environment: %w", err)
	}
	err := d.attemptStage(ctx, instance, StageGetSources, "GET_SOURCES_ATTEMPTS")
	if err == nil {
		err = d.attemptStage(ctx, instance, StageRestoreCache, "RESTORE_CACHE_ATTEMPTS")
	}
	if err == nil {
		err = d.attemptStage(ctx, instance, StageDownloadArtifacts, "ARTIFACT_DOWNLOAD_ATTEMPTS")
	}
	if err == nil {
		err = d.executeUserScripts(ctx, instance)
	}

	archiveStage, uploadStage := StageArchiveCache, StageUploadOnSuccess
	if err != nil {
		archiveStage, uploadStage = StageArchiveCacheOnFailure, StageUploadOnFailure
	}
	archiveErr := d.runStage(ctx, instance, archiveStage)
	uploadErr := d.runStage(ctx, instance, uploadStage)
	// The job's own error matters most, then the cache's, then the upload's.
	err = firstError(err, archiveErr, uploadErr)

	if cleanupErr := d.runStage(ctx, instance, StageCleanupFileVariables); cleanupErr != nil {
		fmt.Fprintf(d.cleanupLog, "WARNING: Error while executing file based variables removal script: %v\n", cleanupErr)
	}
	return err
}

func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// attemptStage runs stage up to the job's <attemptsVariable> times (1-10,
// default 1); get_sources clears the worktree before its second attempt.
func (d *driver) attemptStage(ctx context.Context, instance *executorInstance, stage, attemptsVariable string) error {
	attempts, err := strconv.Atoi(d.allVariables().get(attemptsVariable))
	if err != nil {
		attempts = 1
	}
	attempts = max(1, min(maxStageAttempts, attempts))

	for attempt := range attempts {
		if attempt == 1 && stage == StageGetSources {
			if err = d.runStage(ctx, instance, StageClearWorktree); err != nil {
				continue
			}
		}
		if err = d.runStage(ctx, instance, stage); err == nil {
			return nil
		}
	}
	return err
}

// executeUserScripts runs the job's script steps, then after_script (5 min
// at most, with CI_JOB_STATUS set) whose failure does not fail the job
// unless AFTER_SCRIPT_IGNORE_ERRORS=false.
func (d *driver) executeUserScripts(ctx context.Context, instance *executorInstance) error {
	var err error
	for _, step := range d.job.Steps {
		if step.Name == fakegitlab.StepNameAfterScript {
			continue
		}
		if err = d.runStage(ctx, instance, stepStage(step)); err != nil {
			break
		}
	}

	afterCtx, cancel := context.WithTimeout(ctx, afterScriptTimeout)
	defer cancel()
	d.jobStatus = runtimeState(err)
	afterErr := d.runStage(afterCtx, instance, StageAfterScript)
	d.jobStatus = ""
	if afterErr != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		if d.allVariables().get("AFTER_SCRIPT_IGNORE_ERRORS") != "false" {
			d.log.printf("%sWARNING: after_script failed, but job will continue unaffected: %v%s\n", ansiYellow, afterErr, ansiReset)
		} else if err == nil {
			err = afterErr
		}
	}
	return err
}

// runtimeState is CI_JOB_STATUS for an outcome so far.
func runtimeState(err error) string {
	switch {
	case err == nil:
		return fakegitlab.StateSuccess
	case errors.Is(err, context.Canceled):
		return fakegitlab.StateCanceled
	case errors.Is(err, context.DeadlineExceeded):
		return stateTimedOut
	default:
		return fakegitlab.StateFailed
	}
}

// runStage writes the stage's script and calls run_exec with it, unless the
// stage has nothing to do or the job is already over.
func (d *driver) runStage(ctx context.Context, instance *executorInstance, stage string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	script, skip, err := d.stageScript(stage)
	if err != nil || skip {
		return err
	}
	d.log.printf("%s%s%s\n", ansiBoldCyan, stageDescription(stage), ansiReset)

	scriptDir, err := os.MkdirTemp(instance.tempDir, stageScriptDirectoryPrefix)
	if err != nil {
		return err
	}
	scriptFile := filepath.Join(scriptDir, "script")
	if err := os.WriteFile(scriptFile, []byte(script), 0o700); err != nil {
		return err
	}
	execStage := stage
	if stage == StageStepScript {
		execStage = StageBuildScript
	}
	executor := d.config.Executor
	args := append(slices.Clone(executor.RunArgs), scriptFile, execStage)
	return d.call(ctx, instance, Call{Executable: ExecutableRun, Stage: execStage, Args: args}, executor.RunExec, d.log, d.log)
}

// cleanup is executor.Cleanup: cleanup_exec under a fresh context (it runs
// after a cancel too), output to the runner's log, failure only a warning;
// then the temporary directory goes.
func (d *driver) cleanup(instance *executorInstance) {
	defer os.RemoveAll(instance.tempDir)
	executor := d.config.Executor
	if executor.CleanupExec == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), executor.EffectiveTimeouts().CleanupExec)
	defer cancel()
	err := d.call(ctx, instance, Call{Executable: ExecutableCleanup, Args: executor.CleanupArgs},
		executor.CleanupExec, d.cleanupLog, d.cleanupLog)
	if err != nil {
		fmt.Fprintf(d.cleanupLog, "WARNING: Cleanup script failed: %v\n", err)
	}
}

// call runs one executable with the protocol's environment and records it.
func (d *driver) call(ctx context.Context, instance *executorInstance, call Call, executable string, stdout, stderr io.Writer) error {
	timeouts := d.config.Executor.EffectiveTimeouts()
	call.Attempt = instance.attempt
	call.Started = time.Now()
	call.ExitCode, call.Err = invocation{
		executable:          executable,
		args:                call.Args,
		dir:                 instance.tempDir,
		env:                 d.environment(instance),
		stdout:              stdout,
		stderr:              stderr,
		gracefulKillTimeout: timeouts.GracefulKill,
		forceKillTimeout:    timeouts.ForceKill,
		buildExitCodeFile:   instance.buildExitCodeFile,
	}.run(ctx)
	call.Duration = time.Since(call.Started)
	d.result.Calls = append(d.result.Calls, call)
	return call.Err
}

// environment is what every executable gets, in the runner's order; when a
// key repeats, the later value wins (os/exec keeps the last).
func (d *driver) environment(instance *executorInstance) []string {
	env := slices.Clone(d.config.ProcessEnv)
	env = append(env,
		"TMPDIR="+instance.tempDir,
		fmt.Sprintf("BUILD_FAILURE_EXIT_CODE=%d", BuildFailureExitCode),
		fmt.Sprintf("SYSTEM_FAILURE_EXIT_CODE=%d", SystemFailureExitCode),
		"BUILD_EXIT_CODE_FILE="+instance.buildExitCodeFile,
		"JOB_RESPONSE_FILE="+instance.jobResponseFile,
	)
	// job_env comes before the job's variables so it cannot override them.
	for _, key := range slices.Sorted(maps.Keys(instance.jobEnv)) {
		env = append(env, key+"="+instance.jobEnv[key])
	}
	for _, variable := range d.allVariables() {
		env = append(env, "CUSTOM_ENV_"+variable.Key+"="+variable.Value)
	}
	return append(env, "CUSTOM_ENV_CI_JOB_SERVICES="+d.servicesVariable())
}

// finish records the outcome and logs it like Build.setTraceStatus.
func (d *driver) finish(err error, duration time.Duration) {
	result := d.result
	result.Duration = duration
	result.Err = err
	var buildError *BuildError
	switch {
	case err == nil:
		result.State = fakegitlab.StateSuccess
		d.log.printf("%sJob succeeded%s\n", ansiBoldGreen, ansiReset)
	case errors.As(err, &buildError):
		result.State = fakegitlab.StateFailed
		result.FailureReason = valueOr(buildError.Reason, ReasonScriptFailure)
		result.ExitCode = buildError.ExitCode
		d.log.printf("%sERROR: Job failed: %v%s\n", ansiBoldRed, err, ansiReset)
	default:
		result.State = fakegitlab.StateFailed
		result.FailureReason = ReasonSystemFailure
		d.log.printf("%sERROR: Job failed (system failure): %v%s\n", ansiBoldRed, err, ansiReset)
	}
	result.Log = d.log.String()
	result.CleanupLog = d.cleanupLog.String()
}

func (d *driver) serverURL() string {
	if d.config.URL != "" {
		return d.config.URL
	}
	value, _ := d.job.Variable("CI_SERVER_URL")
	return value
}

// maskedValues are the values the runner hides in the job log; like GitLab
// it only masks values of 8 characters or more.
func maskedValues(job fakegitlab.Job) []string {
	var values []string
	for _, variable := range job.Variables {
		if variable.Masked && len(variable.Value) >= 8 {
			values = append(values, variable.Value)
		}
	}
	return values
}

// jobLog collects the job log, masking secrets in each write (a secret split
// across two writes stays visible; the runner's masker is stricter).
type jobLog struct {
	masked []string
	tee    io.Writer
	buffer testutil.LockedBuffer
}

func newJobLog(masked []string, tee io.Writer) *jobLog {
	return &jobLog{masked: masked, tee: tee}
}

func (l *jobLog) Write(data []byte) (int, error) {
	text := string(data)
	for _, secret := range l.masked {
		text = strings.ReplaceAll(text, secret, "[MASKED]")
	}
	if _, err := l.buffer.Write([]byte(text)); err != nil {
		return 0, err
	}
	if l.tee != nil {
		_, _ = l.tee.Write([]byte(text))
	}
	return len(data), nil
}

func (l *jobLog) printf(format string, args ...any) { fmt.Fprintf(l, format, args...) }

func (l *jobLog) String() string { return l.buffer.String() }
