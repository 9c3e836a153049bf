// Package prepare implements prepare_exec: it claims a gVisor pod for the job from the warm pool
// that serves the job's image (or, with unknown_image = "cold", cold-starts one from
// cold_template), verifies its isolation, and installs the stage agent in it.
package prepare

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/agentca"
	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/gitlab"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/stages"
)

// Run claims the job's sandbox and leaves it ready for the run stages.
func Run(ctx context.Context, env *stages.Env) error {
	start := env.Clock.Now()
	log := env.Log()
	job, err := env.Job()
	if err != nil {
		return err
	}
	placement, err := env.Config.Place(job.Image)
	if errors.Is(err, config.ErrImageNotAllowed) {
		return failure.PermanentError(nil, "%s", err)
	}
	if err != nil {
		return err
	}
	cluster, err := env.Cluster()
	if err != nil {
		return err
	}
	ca, err := env.AgentCA()
	if err != nil {
		return err
	}
	req := kube.ClaimRequest{
		Namespace:      env.Config.Namespace,
		Name:           env.ClaimName(job),
		Pool:           placement.Pool,
		Runner:         env.Config.RunnerName,
		Job:            kube.Job{ID: job.ID, ProjectID: job.ProjectID, PipelineID: job.PipelineID, Image: job.Image, Timeout: job.Timeout},
		Grace:          env.Config.ClaimGrace.Duration,
		ReadyTimeout:   env.Config.ReadyTimeout.Duration,
		RuntimeClasses: env.Config.RuntimeClasses,
		Binding:        env.Binding(job),
		AgentLog:       env.Config.StageTransport == config.TransportNetwork,
	}
	ahead := &agentAhead{ctx: ctx, ca: ca, job: req.Binding, port: wire.NetworkPort}
	defer ahead.close()
	if ca != nil {
		req.Ahead = ahead.announced
	}
	p := &preparation{env: env, cluster: cluster, ca: ca, ahead: ahead, job: job, req: req, start: start}
	sbx, conn, claimed, err := p.acquire(ctx, placement)
	if err != nil {
		return err
	}
	transport, probe := conn.Transport, conn.Probe
	origin, acquired := sbx.Origin()
	if conn.Fallback != "" {
		log.Warnf("Stages go over exec (slower): %s", conn.Fallback)
	}
	log.Infof("Sandbox ready: %s, pod %s/%s, runtime %s, kernel %s, shell %s, stages over %s, %s in %s, ready in %s",
		origin, sbx.Namespace, sbx.Pod, sbx.RuntimeClass, probe.KernelRelease, probe.Shell, transport,
		acquired, gitlab.Millis(claimed), gitlab.Millis(env.Clock.Since(start)))
	pool := env.Config.Pool(sbx.Pool)
	if line := gitlab.FlowImageIsolation(sbx.Image, sbx.RuntimeClass, sbx.Pool, stages.FencedBy(pool)); line != "" {
		log.Infof("%s", line)
		log.Infof("%s", gitlab.FlowNetworkPolicy(sbx.Image, sbx.Pool, pool != nil && pool.EgressProxy != ""))
	}
	return nil
}

// preparation is what prepare has decided before it claims the job's sandbox.
type preparation struct {
	env     *stages.Env
	cluster stages.Cluster
	ca      *agentca.CA
	ahead   *agentAhead
	job     *gitlab.Job
	req     kube.ClaimRequest
	start   time.Time // when prepare started
}

// acquire claims (or cold-starts) the job's sandbox, connects to its agent, checks its fence,
// grants its egress and saves the job's state, inside the job log's sandbox_claim section.
func (p *preparation) acquire(ctx context.Context, placement config.Placement) (sbx *kube.Sandbox, conn executor.Connection, claimed time.Duration, err error) {
	env, cluster, req := p.env, p.cluster, p.req
	log := env.Log()
	if placement.ColdTemplate != "" {
		defer log.Section("sandbox_claim", "Cold-starting a gVisor sandbox from template "+placement.ColdTemplate)()
		log.Warnf("Image %s is served by no warm pool: cold start of a sandbox from template %s (unknown_image = \"cold\")", p.job.Image, placement.ColdTemplate)
		sbx, err = cluster.ColdStart(ctx, req, placement.ColdTemplate)
	} else {
		defer log.Section("sandbox_claim", "Claiming a gVisor sandbox from pool "+placement.Pool)()
		if sbx, err = claimFromPool(ctx, env, cluster, req); err == nil {
			err = p.checkImage(ctx, sbx, placement)
		}
	}
	if err != nil {
		return nil, conn, 0, err
	}
	claimed = env.Clock.Since(p.start)
	log.Debugf("Sandbox acquired %s after prepare started", gitlab.Millis(claimed))
	agentStart := env.Clock.Now()
	if sbx.AgentBaked {
		conn, err = executor.ConnectAgent(ctx, cluster, sbx, wire.NetworkPort, p.ca, req.Binding, p.ahead.dial)
	} else {
		conn, err = installAgent(ctx, env, cluster, sbx, p.ca, req.Binding)
	}
	if err != nil {
		return nil, conn, 0, err
	}
	log.Debugf("Stage agent ready (baked in: %t, TLS made ahead: %t) in %s", sbx.AgentBaked, conn.Ahead, gitlab.Millis(env.Clock.Since(agentStart)))
	if err := checkFence(ctx, env, cluster, sbx, conn.Transport, p.ca, req, conn.Probe.Fence); err != nil {
		return nil, conn, 0, err
	}
	if err := p.grantAndKeep(ctx, sbx, conn.Transport, claimed); err != nil {
		return nil, conn, 0, err
	}
	return sbx, conn, claimed, nil
}

// checkImage holds the pod claimed from a pool to the image the job asked for: the same image,
// or, from a pool with serve_other_tags, another tag of it, which the job log names with the image
// the job runs in. A pod of a pool that serves exact images but runs another one (its
// SandboxTemplate changed, or its [[pool]] images list an image it does not run) is released
// before any script runs, and the job fails naming both images.
func (p *preparation) checkImage(ctx context.Context, sbx *kube.Sandbox, placement config.Placement) error {
	asked := p.job.Image
	if asked == "" || config.SameImage(asked, sbx.Image) {
		return nil
	}
	if placement.OtherTag {
		p.env.Log().Warnf("The job asked for image %s but runs in %s, the image of pool %s (serve_other_tags = true)", asked, sbx.Image, sbx.Pool)
		return nil
	}
	released := release(ctx, p.cluster, sbx, p.req.Binding, kube.Outcome{Result: kube.OutcomeFailed, Reason: kube.ReasonPermanent})
	return failure.PermanentError(nil, "pool %s runs image %s, not %s that the job asks for: list only the image its SandboxTemplate runs in its [[pool]] images in %s; %s",
		sbx.Pool, sbx.Image, asked, p.env.Config.Path(), released)
}

// grantAndKeep grants the pod its egress, installs the runner helper if the job needs it and
// saves the job's state for the run and cleanup stages. A failure after the grant withdraws
// it: cleanup would find no state to withdraw it by.
func (p *preparation) grantAndKeep(ctx context.Context, sbx *kube.Sandbox, transport executor.Transport, claimed time.Duration) error {
	if err := grantEgress(ctx, p.env, p.cluster, p.job, sbx, p.req.Binding); err != nil {
		return err
	}
	agent, err := transport.Executor(sbx, p.cluster.Exec(), p.ca, p.req.Binding)
	if err == nil {
		err = executor.InstallHelper(ctx, agent, p.cluster.Exec(), sbx, p.env.Config.HelperBinary, p.job, p.env.Log())
	}
	if err == nil {
		state := &executor.JobState{Sandbox: sbx, Transport: transport, Overhead: executor.Overhead{Claim: claimed, Prepare: p.env.Elapsed(p.start)},
			Deadline: p.start.Add(p.job.Timeout)}
		err = executor.SaveJob(p.env.Runner.TmpDir, state)
	}
	if err != nil {
		p.env.RevokeEgress(ctx, sbx)
	}
	return err
}

// agentAhead connects to the agent of the sandbox the claim announces (kube.ClaimRequest.Ahead:
// in the stage server, with its identity line read ahead), so that the TLS handshake overlaps the
// read and verification of its pod. ConnectAgent sends the probe on it only if the verified pod
// shows the same address and identity; nothing is sent before.
type agentAhead struct {
	ctx  context.Context
	ca   *agentca.CA
	job  string
	port int
	dial *executor.AgentDial
}

// announced starts the connection, once, if the line is an agent's identity.
func (a *agentAhead) announced(podIP, line string) {
	if identity, _, ok := wire.ParseFirstLogLine(line); ok && identity != "" && a.dial == nil {
		a.dial = executor.DialAhead(a.ctx, podIP, a.port, a.ca, a.job, identity)
	}
}

func (a *agentAhead) close() { a.dial.Close() }

// installAgent copies the agent into a pod whose template does not bake it in, over exec, and
// with ca connects to it over the pod network: the install exec reports its identity.
func installAgent(ctx context.Context, env *stages.Env, cluster stages.Cluster, sbx *kube.Sandbox, ca *agentca.CA, binding string) (executor.Connection, error) {
	// Only pods without a baked agent need the binary: read it here, not on every prepare.
	agentBinary, err := readAgent(env.Config)
	if err != nil {
		return executor.Connection{}, err
	}
	probe, err := executor.InstallAgent(ctx, cluster.Exec(), sbx, agentBinary, ca)
	if err != nil || ca == nil {
		return executor.Connection{Probe: probe}, err
	}
	if probe.Identity == "" {
		return executor.Connection{Probe: probe, Fallback: "the agent installed in pod " + sbx.Pod + " serves no network path"}, nil
	}
	conn, err := executor.ConnectNetwork(ctx, sbx, wire.NetworkPort, ca, binding, probe.Identity)
	if conn.Probe == nil {
		conn.Probe = probe
	}
	return conn, err
}

// claimFromPool claims the job's sandbox from its warm pool, with drained_pool = "wait" first
// waiting out a drained pool. The job log says how the job got its sandbox from the claim's
// outcome (kube.Sandbox.Origin), never from the pool's state before it: a refill can turn a
// sandbox Ready between the check and the claim, and a claim on a drained pool mostly adopts a
// booting pool sandbox rather than cold-starting one.
func claimFromPool(ctx context.Context, env *stages.Env, cluster stages.Cluster, req kube.ClaimRequest) (*kube.Sandbox, error) {
	if env.Config.DrainedPool != config.DrainedPoolWait {
		return claimWhileCheckingPool(ctx, env, cluster, req)
	}
	log := env.Log()
	pool := req.Pool
	status, err := cluster.CheckPool(ctx, req.Namespace, pool)
	if err != nil {
		return nil, err
	}
	log.Debugf("Warm pool %s before the claim: %d of %d ready", pool, status.Ready, status.Replicas)
	var waitFrom time.Time
	if status.Ready == 0 {
		// What prepare does, not a guess at the outcome: the wait can be long, and the line says why.
		log.Warnf("Warm pool %s is drained (0 of %d ready): waiting for a warm sandbox (drained_pool = \"wait\")", pool, status.Replicas)
		waitFrom = env.Clock.Now()
		if err := cluster.WaitPoolReady(ctx, req.Namespace, pool, req.ReadyTimeout); err != nil {
			return nil, err
		}
	}
	sbx, err := cluster.Claim(ctx, req)
	if err == nil && !waitFrom.IsZero() && sbx.Launch != kube.LaunchCold {
		// The job waited for its warm sandbox, in the pool's wait if not also in the claim's.
		sbx.Launch, sbx.Waited = kube.LaunchWaited, env.Clock.Since(waitFrom)
	}
	return sbx, err
}

// claimWhileCheckingPool claims with drained_pool = "cold": what the pool holds changes nothing
// the claim does, so the pool is read alongside the claim rather than before it (a round trip
// off every prepare). A missing or unreadable pool still fails the job with the pool's own
// message, and the claim made meanwhile is released.
func claimWhileCheckingPool(ctx context.Context, env *stages.Env, cluster stages.Cluster, req kube.ClaimRequest) (*kube.Sandbox, error) {
	claimCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var status kube.PoolStatus
	var poolErr error
	checked := make(chan struct{})
	go func() {
		defer close(checked)
		if status, poolErr = cluster.CheckPool(ctx, req.Namespace, req.Pool); poolErr != nil {
			cancel()
		}
	}()
	sbx, err := cluster.Claim(claimCtx, req)
	<-checked
	if poolErr != nil {
		// The claim may exist even if Claim was cut short; releasing one that does not is success.
		_ = cluster.Release(ctx, req.Namespace, req.Name, req.Binding, kube.Outcome{Result: kube.OutcomeFailed, Reason: kube.ReasonPrepare})
		return nil, poolErr
	}
	env.Log().Debugf("Warm pool %s at the claim: %d of %d ready", req.Pool, status.Ready, status.Replicas)
	return sbx, err
}

// checkFence takes the fresh check of the pod's egress fence that the agent's probe carried
// (probed), or asks the agent for one (an agent older than that), after the claim is Ready and
// before any script runs: the kubelet's readiness probe keeps unfenced warm pods from
// being handed out, but the policy can lapse between its last probe and this job. A fence that
// does not hold is a system failure, and the pod is released first, so that the runner's retry
// claims another sandbox instead of adopting this one.
func checkFence(ctx context.Context, env *stages.Env, cluster stages.Cluster, sbx *kube.Sandbox, transport executor.Transport, ca *agentca.CA, req kube.ClaimRequest, probed *wire.FenceReport) error {
	log := env.Log()
	since := env.Clock.Now()
	report := probed
	if report == nil {
		agent, err := transport.Executor(sbx, cluster.Exec(), ca, req.Binding)
		if err != nil {
			return err
		}
		if report, err = executor.CheckFence(ctx, agent, sbx); err != nil {
			return err
		}
	}
	switch {
	case !report.Configured && env.Config.RequireFence:
		_, _ = releaseSandbox(ctx, cluster, sbx, req.Binding, kube.Outcome{Result: kube.OutcomeFailed, Reason: kube.ReasonPermanent})
		return failure.PermanentError(nil, "pod %s/%s has no egress fence check and require_fence is set: give %s %s and %s (docs/security.md)",
			sbx.Namespace, sbx.Pod, templateOf(sbx), wire.FenceDenyEnv, wire.FenceAllowEnv)
	case !report.Configured:
		log.Debugf("Egress fence not checked: %s", report)
	case !report.Holds:
		released := release(ctx, cluster, sbx, req.Binding, kube.Outcome{Result: kube.OutcomeFailed, Reason: kube.ReasonFence})
		return failure.SystemError(nil, "the egress fence of pod %s/%s does not hold: %s (is NetworkPolicy enforced on its node?); %s", sbx.Namespace, sbx.Pod, report, released)
	case probed != nil:
		log.Debugf("Egress fence holds (checked with the probe)")
	default:
		log.Debugf("Egress fence holds (checked in %s)", gitlab.Millis(env.Clock.Since(since)))
	}
	return nil
}

// releaseSandbox releases the job's claim or cold-started Sandbox, and says so for the job log.
func releaseSandbox(ctx context.Context, cluster stages.Cluster, sbx *kube.Sandbox, binding string, outcome kube.Outcome) (string, error) {
	if sbx.ColdTemplate != "" {
		return "its Sandbox " + sbx.SandboxName + " was deleted", cluster.ReleaseColdStart(ctx, sbx.Namespace, sbx.SandboxName, binding, outcome)
	}
	return "its claim " + sbx.Claim + " was released", cluster.Release(ctx, sbx.Namespace, sbx.Claim, binding, outcome)
}

// release releases the job's claim or cold-started Sandbox on a failure, and says what became of
// it for the failure's line.
func release(ctx context.Context, cluster stages.Cluster, sbx *kube.Sandbox, binding string, outcome kube.Outcome) string {
	released, err := releaseSandbox(ctx, cluster, sbx, binding, outcome)
	if err != nil {
		return "not released (" + failure.OneLine(err.Error()) + ")"
	}
	return released
}

// templateOf names the template to fix, for messages.
func templateOf(sbx *kube.Sandbox) string {
	if sbx.ColdTemplate != "" {
		return "SandboxTemplate " + sbx.ColdTemplate
	}
	return "the SandboxTemplate of pool " + sbx.Pool
}

func readAgent(cfg *config.Config) ([]byte, error) {
	path := cfg.AgentBinary
	if path == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, failure.PermanentError(err, "locating the stage agent: set agent_binary in %s", cfg.Path())
		}
		path = stages.AgentNextTo(self)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, failure.PermanentError(nil, "stage agent %s: %v (install sandbox-executor-agent next to sandbox-executor or set agent_binary in %s)", path, failure.WithoutPath(err), cfg.Path())
	}
	return data, nil
}
