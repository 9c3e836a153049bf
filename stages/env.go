// Package stages holds what every stage of the custom executor protocol shares; each stage
// (configure, prepare, run, cleanup) is a package of its own below it. The operator's verbs
// (operator/gc, operator/doctor, operator/exporter) run in the same Env, which Setup builds.
package stages

import (
	"context"
	"io"
	"path/filepath"
	"time"

	"k8s.io/utils/clock"

	"github.com/sandbox-executor/sandbox-executor/agentca"
	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/gitlab"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// DriverName is reported to the runner, which prints it in the job log.
const DriverName = "sandbox-executor"

// Env is one stage invocation's world: configuration, what the runner passed, the cluster, and
// where output goes (stdout and stderr both land in the job log, except for config).
type Env struct {
	Config  *config.Config
	Runner  gitlab.RunnerEnv
	Version string
	Stdout  io.Writer
	Stderr  io.Writer
	// Getenv reads the stage's environment.
	Getenv func(string) string
	// Clients connects to the cluster; called only by commands that need it.
	Clients func() (*kube.Clients, error)
	// Clock is the stage's time (a fake clock in tests).
	Clock clock.Clock
	// Started is when this invocation began, before the configuration was read: the start of
	// what the stage costs the job.
	Started time.Time
}

// Cluster is what the protocol stages ask of Kubernetes (kube.Claimer does it).
type Cluster interface {
	CheckPool(ctx context.Context, namespace, pool string) (kube.PoolStatus, error)
	WaitPoolReady(ctx context.Context, namespace, pool string, timeout time.Duration) error
	Claim(ctx context.Context, req kube.ClaimRequest) (*kube.Sandbox, error)
	ColdStart(ctx context.Context, req kube.ClaimRequest, template string) (*kube.Sandbox, error)
	Find(ctx context.Context, namespace, claimName, binding string, runtimeClasses []string) (*kube.Sandbox, error)
	PodGone(ctx context.Context, sbx *kube.Sandbox) (string, error)
	Release(ctx context.Context, namespace, claim, binding string, outcome kube.Outcome) error
	ReleaseColdStart(ctx context.Context, namespace, name, binding string, outcome kube.Outcome) error
	Exec() kube.RemoteExecutor
	FirstLogLine(ctx context.Context, sbx *kube.Sandbox, within time.Duration) (string, error)
}

// Elapsed is the time since this invocation began (since the stage's own start when Started is
// unset).
func (e *Env) Elapsed(fallback time.Time) time.Duration {
	if e.Started.IsZero() {
		return e.Clock.Since(fallback)
	}
	return e.Clock.Since(e.Started)
}

// Log is the job log for the executor's own lines.
func (e *Env) Log() *gitlab.JobLog {
	return gitlab.NewJobLog(e.Stderr, e.Config.Debug, e.Clock)
}

// Cluster connects to the cluster.
func (e *Env) Cluster() (Cluster, error) {
	claimer, err := e.Claimer()
	if err != nil {
		return nil, err
	}
	return claimer, nil
}

// Claimer connects to the cluster, for the operator commands that list and release.
func (e *Env) Claimer() (*kube.Claimer, error) {
	clients, err := e.Clients()
	if err != nil {
		return nil, err
	}
	log := e.Log()
	claimer := kube.NewClaimer(clients, e.Clock)
	claimer.Step = func(step string, took time.Duration) { log.Debugf("%s in %s", step, gitlab.Millis(took)) }
	return claimer, nil
}

// Job identifies the job: from JOB_RESPONSE_FILE (the trusted source), or on runners too old
// to write it, from CUSTOM_ENV_* variables.
func (e *Env) Job() (*gitlab.Job, error) {
	if e.Runner.JobResponseFile == "" && e.Getenv != nil {
		return gitlab.JobFromEnv(e.Getenv)
	}
	return gitlab.ReadJob(e.Runner.JobResponseFile)
}

// ClaimName is the job's claim, derived from the trusted job JSON: keyed with the job's token, so
// only this job has it (kube.ClaimName).
func (e *Env) ClaimName(job *gitlab.Job) string {
	return kube.ClaimName(job.Token, e.Config.RunnerName, job.ID)
}

// Binding binds what the job makes in the cluster to the job (kube.JobBinding of its token): no
// other job with the same claim name adopts, runs in or releases it.
func (e *Env) Binding(job *gitlab.Job) string {
	return kube.JobBinding(job.Token, e.Config.Namespace, e.ClaimName(job))
}

// AgentCA is the agent CA the network transport's client certificates come from; nil when the
// stages go over exec.
func (e *Env) AgentCA() (*agentca.CA, error) {
	if e.Config.StageTransport != config.TransportNetwork {
		return nil, nil
	}
	ca, err := agentca.Load(e.Config.AgentCACert, e.Config.AgentCAKey)
	if err != nil {
		return nil, failure.PermanentError(nil, "agent CA (agent_ca_cert, agent_ca_key in %s): %v", e.Config.Path(), err)
	}
	if now := e.Clock.Now(); now.After(ca.NotAfter()) {
		return nil, failure.PermanentError(nil, "agent CA %s expired on %s: make a new one and roll it out (docs/security.md#rotating-the-agent-ca)", e.Config.AgentCACert, ca.NotAfter().Format(time.DateOnly))
	}
	return ca, nil
}

// AgentNextTo is the default agent binary path: beside the executor binary.
func AgentNextTo(executable string) string {
	return filepath.Join(filepath.Dir(executable), "sandbox-executor-agent")
}
