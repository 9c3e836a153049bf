// Package stages holds what every stage of the custom executor protocol shares; each stage
// (configure, prepare, run, cleanup) is a package of its own below it.
package stages

import (
	"io"
	"path/filepath"
	"time"

	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/executor"
)

// DriverName is reported to the runner, which prints it in the job log.
const DriverName = "sandbox-executor"

// Env is one stage invocation's world: configuration, what the runner passed, the cluster, and
// where output goes (stdout and stderr both land in the job log, except for config).
type Env struct {
	Config  *config.Config
	Runner  executor.RunnerEnv
	Version string
	Stdout  io.Writer
	Stderr  io.Writer
	// Getenv reads the stage's environment.
	Getenv func(string) string
	// Clients connects to the cluster; called only by stages that need it.
	Clients func() (*executor.Clients, error)
	// Now is the clock, replaced in tests.
	Now func() time.Time
	// Started is when this invocation began, before the configuration was read: the start of
	// what the stage costs the job.
	Started time.Time
}

// Elapsed is the time since this invocation began (since the stage's own start when Started is
// unset).
func (e *Env) Elapsed(fallback time.Time) time.Duration {
	if e.Started.IsZero() {
		return e.Since(fallback)
	}
	return e.Since(e.Started)
}

// Log is the job log for the executor's own lines.
func (e *Env) Log() *executor.JobLog {
	return &executor.JobLog{W: e.Stderr, Debug: e.Config.Debug, Now: e.Now}
}

// Claimer connects to the cluster.
func (e *Env) Claimer() (*executor.Claimer, error) {
	clients, err := e.Clients()
	if err != nil {
		return nil, err
	}
	return &executor.Claimer{Clients: clients, Now: e.Now, Debugf: e.Log().Debugf}, nil
}

// Job identifies the job: from JOB_RESPONSE_FILE (the trusted source), or on runners too old
// to write it, from CUSTOM_ENV_* variables.
func (e *Env) Job() (*executor.Job, error) {
	if e.Runner.JobResponseFile == "" && e.Getenv != nil {
		return executor.JobFromEnv(e.Getenv)
	}
	return executor.ReadJob(e.Runner.JobResponseFile)
}

// ClaimName is the job's claim, derived from the trusted job JSON.
func (e *Env) ClaimName(job *executor.Job) string {
	return executor.ClaimName(e.Config.RunnerName, job.ID)
}

// Since measures time with the stage's clock.
func (e *Env) Since(t time.Time) time.Duration {
	if e.Now != nil {
		return e.Now().Sub(t)
	}
	return time.Since(t)
}

// Clock returns the current time from the stage's clock.
func (e *Env) Clock() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now()
}

// AgentNextTo is the default agent binary path: beside the executor binary.
func AgentNextTo(executable string) string {
	return filepath.Join(filepath.Dir(executable), "sandbox-executor-agent")
}
