package runner

import (
	"strconv"
	"time"
)

// CustomExecutor is a custom executor definition: the [runners.custom]
// section of a runner's config.toml, rendered as run-single flags.
type CustomExecutor struct {
	ConfigExec        string
	ConfigArgs        []string
	ConfigExecTimeout time.Duration // 0: the runner's default, 1 h

	PrepareExec        string
	PrepareArgs        []string
	PrepareExecTimeout time.Duration // 0: 1 h

	// RunExec is required; it is called once per stage with
	// RunArgs... <script path> <stage name>.
	RunExec string
	RunArgs []string

	CleanupExec        string
	CleanupArgs        []string
	CleanupExecTimeout time.Duration // 0: 1 h

	// GracefulKillTimeout is how long a stage may take to exit after
	// SIGTERM (on cancel or timeout) before it gets SIGKILL; 0: 10 min.
	GracefulKillTimeout time.Duration
	// ForceKillTimeout is how long the runner then waits for the killed
	// process before abandoning it; 0: 10 s.
	ForceKillTimeout time.Duration
}

// The runner's defaults for the timeouts left at zero (executors/custom/consts.go).
const (
	DefaultConfigExecTimeout   = time.Hour
	DefaultPrepareExecTimeout  = time.Hour
	DefaultCleanupExecTimeout  = time.Hour
	DefaultGracefulKillTimeout = 10 * time.Minute
	DefaultForceKillTimeout    = 10 * time.Second
)

// runSingleFlags renders the definition as `run-single` flags. The runner
// takes timeouts in whole seconds; a zero duration leaves the runner's
// default.
func (e CustomExecutor) runSingleFlags() []string {
	flags := []string{"--executor", "custom"}
	executable := func(name, path string, args []string) {
		if path == "" {
			return
		}
		flags = append(flags, "--custom-"+name+"-exec", path)
		for _, arg := range args {
			flags = append(flags, "--custom-"+name+"-args", arg)
		}
	}
	seconds := func(name string, timeout time.Duration) {
		if timeout > 0 {
			flags = append(flags, "--custom-"+name, strconv.Itoa(max(1, int(timeout.Round(time.Second)/time.Second))))
		}
	}
	executable("config", e.ConfigExec, e.ConfigArgs)
	seconds("config-exec-timeout", e.ConfigExecTimeout)
	executable("prepare", e.PrepareExec, e.PrepareArgs)
	seconds("prepare-exec-timeout", e.PrepareExecTimeout)
	executable("run", e.RunExec, e.RunArgs)
	executable("cleanup", e.CleanupExec, e.CleanupArgs)
	seconds("cleanup-exec-timeout", e.CleanupExecTimeout)
	seconds("graceful-kill-timeout", e.GracefulKillTimeout)
	seconds("force-kill-timeout", e.ForceKillTimeout)
	return flags
}

// Timeouts are a definition's timeouts with the runner's defaults applied.
type Timeouts struct {
	ConfigExec, PrepareExec, CleanupExec time.Duration
	GracefulKill, ForceKill              time.Duration
}

// EffectiveTimeouts returns the timeouts the runner applies for e.
func (e CustomExecutor) EffectiveTimeouts() Timeouts {
	return Timeouts{
		ConfigExec:   orDefault(e.ConfigExecTimeout, DefaultConfigExecTimeout),
		PrepareExec:  orDefault(e.PrepareExecTimeout, DefaultPrepareExecTimeout),
		CleanupExec:  orDefault(e.CleanupExecTimeout, DefaultCleanupExecTimeout),
		GracefulKill: orDefault(e.GracefulKillTimeout, DefaultGracefulKillTimeout),
		ForceKill:    orDefault(e.ForceKillTimeout, DefaultForceKillTimeout),
	}
}

func orDefault(value, fallback time.Duration) time.Duration {
	if value > 0 {
		return value
	}
	return fallback
}
