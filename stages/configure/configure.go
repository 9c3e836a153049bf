// Package configure implements config_exec: it tells the runner where builds and caches live in
// the job pod and what to call the job's host.
package configure

import (
	"encoding/json"

	"github.com/sandbox-executor/sandbox-executor/stages"
)

// Output is the runner's ConfigExecOutput (executors/custom/api/config.go in gitlab-runner).
type Output struct {
	BuildsDir         string            `json:"builds_dir,omitempty"`
	CacheDir          string            `json:"cache_dir,omitempty"`
	BuildsDirIsShared *bool             `json:"builds_dir_is_shared,omitempty"`
	Hostname          string            `json:"hostname,omitempty"`
	Driver            *Driver           `json:"driver,omitempty"`
	JobEnv            map[string]string `json:"job_env,omitempty"`
	Shell             string            `json:"shell,omitempty"`
}

// Driver names the executor in the job log.
type Driver struct {
	Name    string `json:"name,omitempty"`
	Version string `json:"version,omitempty"`
}

// Run prints the ConfigExecOutput JSON on stdout, and nothing else: the runner parses all of it.
func Run(env *stages.Env) error {
	notShared := false
	out := Output{
		BuildsDir:         env.Config.BuildsDir,
		CacheDir:          env.Config.CacheDir,
		BuildsDirIsShared: &notShared, // one pod per job
		Hostname:          env.Config.RunnerName,
		Driver:            &Driver{Name: stages.DriverName, Version: env.Version},
		// Tells the later executables (not the job: job_env is their environment) where the job runs; no secrets.
		JobEnv: map[string]string{"SANDBOX_EXECUTOR_NAMESPACE": env.Config.Namespace},
	}
	// The job's claim makes a better host name, when the runner has written the job JSON already.
	if job, err := env.Job(); err == nil {
		out.Hostname = env.ClaimName(job)
	}
	enc := json.NewEncoder(env.Stdout)
	return enc.Encode(out)
}
