package kube

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
)

// ClaimRequest describes the claim prepare makes for a job.
type ClaimRequest struct {
	Namespace string
	// Name is the claim's (or the cold-started Sandbox's) name: ClaimName of the job.
	Name           string
	Pool           string
	Runner         string
	Job            Job
	Grace          time.Duration
	ReadyTimeout   time.Duration
	RuntimeClasses []string
	// Binding is the job's JobBinding: the claim (or cold-started Sandbox) carries it, and only a
	// job with the same one adopts it.
	Binding string
	// AgentLog reads the job container's first log line alongside the pod (Sandbox.AgentLogLine):
	// the network transport pins the agent's key from it, and reading it here saves prepare a
	// round trip after the claim.
	AgentLog bool
	// Ahead, if set, is told the claim's sandbox as soon as it is seen adopted, before its pod is
	// read and verified: the address its pod had and the identity line read ahead for it (the
	// stage server's AgentLines), so that prepare can connect to the agent meanwhile
	// (executor.DialAhead). Neither is trusted: nothing may be sent to the pod before Claim
	// returns it verified, with the line it verified. It is called at most once, on the
	// goroutine that called Claim, before Claim returns: it needs no lock.
	Ahead func(podIP, agentLine string)
}

// Job is what the cluster is told of a job: who it is (labels), its image (cold starts) and its
// timeout (how long what it owns may live).
type Job struct {
	ID, ProjectID, PipelineID int64
	Image                     string
	Timeout                   time.Duration
}

// Claimer claims and releases sandboxes.
type Claimer struct {
	clients *Clients
	// clock dates shutdown times and times steps.
	clock clock.PassiveClock
	// Step, when set, is told each finished step of a claim and how long it took (the job log's
	// debug lines).
	Step func(step string, took time.Duration)
}

// step reports a finished step and its duration in debug mode, and starts the next one.
func (c *Claimer) step(since *time.Time, format string, args ...any) {
	if c.Step == nil {
		return
	}
	now := c.clock.Now()
	c.Step(fmt.Sprintf(format, args...), now.Sub(*since))
	*since = now
}

// NewClaimer claims through clients and dates by clk (clock.RealClock{} outside tests).
func NewClaimer(clients *Clients, clk clock.PassiveClock) *Claimer {
	return &Claimer{clients: clients, clock: clk}
}

// shutdownTime is when agent-sandbox deletes what the job made even if cleanup never runs: the
// job's timeout plus claim_grace from now.
func (c *Claimer) shutdownTime(req ClaimRequest) metav1.Time {
	return metav1.NewTime(c.clock.Now().Add(req.Job.Timeout + req.Grace).Truncate(time.Second))
}

// Exec is the transport that runs commands in job pods (pods/exec).
func (c *Claimer) Exec() RemoteExecutor { return c.clients.Exec }

// FirstLogLine is the first line a job container wrote to its stdout (the pod's log, through
// the API server), waiting up to within for it (a log is followed, not polled).
func (c *Claimer) FirstLogLine(ctx context.Context, sbx *Sandbox, within time.Duration) (string, error) {
	if sbx.AgentLogLine != "" {
		return sbx.AgentLogLine, nil // read with the pod
	}
	since := c.clock.Now()
	line, err := firstLogLine(ctx, c.clients.Kube, sbx.Namespace, sbx.Pod, sbx.Container, within)
	c.step(&since, "first log line of pod %s read", sbx.Pod)
	return line, err
}
