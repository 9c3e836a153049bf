// Package prepare implements prepare_exec: it claims a gVisor pod for the job from the warm pool
// that serves the job's image (or, with unknown_image = "cold", cold-starts one from
// cold_template), verifies its isolation, and installs the stage agent in it.
package prepare

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/executor/agent"
	"github.com/sandbox-executor/sandbox-executor/stages"
)

// Run claims the job's sandbox and leaves it ready for the run stages.
func Run(ctx context.Context, env *stages.Env) error {
	start := env.Clock()
	log := env.Log()
	job, err := env.Job()
	if err != nil {
		return err
	}
	placement, err := env.Config.Place(job.Image)
	if errors.Is(err, config.ErrImageNotAllowed) {
		return executor.PermanentError(nil, "%s", err)
	}
	if err != nil {
		return err
	}
	claimer, err := env.Claimer()
	if err != nil {
		return err
	}
	req := executor.ClaimRequest{
		Namespace:      env.Config.Namespace,
		Pool:           placement.Pool,
		Runner:         env.Config.RunnerName,
		Job:            job,
		Grace:          env.Config.ClaimGrace.Duration,
		ReadyTimeout:   env.Config.ReadyTimeout.Duration,
		RuntimeClasses: env.Config.RuntimeClasses,
	}
	var sbx *executor.Sandbox
	var endSection func()
	if placement.ColdTemplate != "" {
		endSection = log.Section("sandbox_claim", "Cold-starting a gVisor sandbox from template "+placement.ColdTemplate)
		log.Warnf("Image %s is served by no warm pool: cold start of a sandbox from template %s (unknown_image = \"cold\")", job.Image, placement.ColdTemplate)
		sbx, err = claimer.ColdStart(ctx, req, placement.ColdTemplate)
	} else {
		endSection = log.Section("sandbox_claim", "Claiming a gVisor sandbox from pool "+placement.Pool)
		sbx, err = claimFromPool(ctx, env, claimer, req, start)
	}
	if err != nil {
		endSection()
		return err
	}
	claimed := env.Since(start)
	log.Debugf("Sandbox acquired %s after prepare started", executor.Millis(claimed))
	var token string
	if env.Config.StageTransport == config.TransportNetwork {
		token = executor.NewAgentToken()
	}
	var probe *agent.Probe
	agentStart := env.Clock()
	if sbx.AgentBaked {
		probe, err = executor.ConnectAgent(ctx, claimer.Clients, sbx, token)
	} else {
		// Only pods without a baked agent need the binary: read it here, not on every prepare.
		var agentBinary []byte
		if agentBinary, err = readAgent(env.Config); err == nil {
			probe, err = executor.InstallAgent(ctx, claimer.Clients.Exec, sbx, agentBinary, token)
		}
		if err == nil && token != "" {
			if _, netErr := executor.ProbeOverNetwork(ctx, sbx, token); !errors.Is(netErr, executor.ErrAgentUnreachable) {
				err = netErr
			}
		}
	}
	if err != nil {
		endSection()
		return err
	}
	log.Debugf("Stage agent ready (baked in: %t, token over attach: %t) in %s", sbx.AgentBaked, sbx.AgentBaked && token != "", executor.Millis(env.Since(agentStart)))
	if err := executor.InstallHelper(ctx, claimer.Clients.Exec, sbx, env.Config.HelperBinary, job, log); err != nil {
		endSection()
		return err
	}
	sbx.Overhead.Claim, sbx.Overhead.Prepare = claimed, env.Elapsed(start)
	if err := executor.SaveSandbox(env.Runner.TmpDir, sbx); err != nil {
		endSection()
		return err
	}
	endSection()
	origin, acquired := sbx.Origin()
	transport := "exec"
	if sbx.AgentToken != "" {
		transport = "pod network"
	}
	if token != "" && sbx.AgentToken == "" {
		log.Warnf("The runner cannot reach pod %s at %s:%d: stages go over exec (slower)", sbx.Pod, sbx.PodIP, agent.NetworkPort)
	}
	log.Infof("Sandbox ready: %s, pod %s/%s, runtime %s, kernel %s, shell %s, stages over %s, %s in %s, ready in %s",
		origin, sbx.Namespace, sbx.Pod, sbx.RuntimeClass, probe.KernelRelease, probe.Shell, transport,
		acquired, executor.Millis(claimed), executor.Millis(env.Since(start)))
	return nil
}

// claimFromPool claims the job's sandbox from its warm pool, first saying (or, with drained_pool
// = "wait", waiting out) a drained pool.
func claimFromPool(ctx context.Context, env *stages.Env, claimer *executor.Claimer, req executor.ClaimRequest, start time.Time) (*executor.Sandbox, error) {
	log := env.Log()
	pool := req.Pool
	status, err := claimer.CheckPool(ctx, req.Namespace, pool)
	if err != nil {
		return nil, err
	}
	if status.Ready == 0 {
		if env.Config.DrainedPool == config.DrainedPoolWait {
			log.Warnf("Warm pool %s is drained (0 of %d ready): waiting for a warm sandbox (drained_pool = \"wait\")", pool, status.Replicas)
			if err := claimer.WaitPoolReady(ctx, req.Namespace, pool, req.ReadyTimeout); err != nil {
				return nil, err
			}
			log.Infof("Warm pool %s has a ready sandbox after %s", pool, executor.Millis(env.Since(start)))
		} else {
			log.Warnf("Warm pool %s is drained (0 of %d ready): this job gets a cold start (drained_pool = \"cold\")", pool, status.Replicas)
		}
	}
	return claimer.Claim(ctx, req)
}

func readAgent(cfg *config.Config) ([]byte, error) {
	path := cfg.AgentBinary
	if path == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, executor.PermanentError(err, "locating the stage agent: set agent_binary in %s", cfg.Path())
		}
		path = stages.AgentNextTo(self)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, executor.PermanentError(nil, "stage agent %s: %v (install sandbox-executor-agent next to sandbox-executor or set agent_binary in %s)", path, unwrap(err), cfg.Path())
	}
	return data, nil
}

func unwrap(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return fmt.Errorf("%w", err)
}
