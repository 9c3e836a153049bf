package kube

import (
	"fmt"
	"time"
)

// Sandbox is a claimed job pod, verified and ready for exec: what the stages after prepare need
// to reach it. The job's state file keeps a copy (package executor), in a record of its own.
type Sandbox struct {
	Namespace   string
	Claim       string
	Pool        string
	SandboxName string
	Pod         string
	// PodUID tells the pod from a replacement of the same name.
	PodUID    string
	Container string
	// Image is the job container's image, as the pod names it.
	Image        string
	RuntimeClass string
	// Launch is how the job got the sandbox (launchOf), and Waited, for LaunchWaited, how long
	// prepare waited for it (0 when not measured: a later stage that found the claim again).
	Launch Launch
	Waited time.Duration
	// ColdTemplate is set when the job owns a Sandbox cold-started from this SandboxTemplate
	// (unknown_image = "cold") instead of a claim: Claim and Pool are then empty, and cleanup
	// deletes the Sandbox SandboxName.
	ColdTemplate string
	PodIP        string
	// AgentBaked: the pod's template bakes the agent in (wire.PodAgentPath runs as the job
	// container's command), so its stage daemon runs from the pod's start.
	AgentBaked bool
	// AgentLogLine is the job container's first log line, read with the pod at prepare when the
	// claim asked for it (ClaimRequest.AgentLog); not kept in the job's state.
	AgentLogLine string
	// agentLogAhead: AgentLogLine was read ahead (AgentLines), for the debug line.
	agentLogAhead bool
	// Restarts is the job container's restart count when the job took the pod. A restart
	// (a memory or fork bomb ending the container, say) loses the job's processes, files and
	// the agent that runs its stages: a higher count ends the job at once.
	Restarts int32
}

// Launch is how a job got its sandbox: what happened, not what the pool looked like before.
type Launch string

const (
	// LaunchWarm: a pool sandbox that was Ready before the job's claim was made.
	LaunchWarm Launch = "warm"
	// LaunchWaited: a pool sandbox the job waited for: adopted while still booting, or one
	// prepare waited for with drained_pool = "wait".
	LaunchWaited Launch = "waited"
	// LaunchCold: a sandbox created for the job: by agent-sandbox from the pool's template when
	// the pool had none to hand out, or by prepare from cold_template.
	LaunchCold Launch = "cold"
)

// Origin says where the job's sandbox came from and how, for the job log's "Sandbox ready" line
// and its closing summary, in the same words ("pool duo-default (warm start)"), and how the job
// got it ("claimed", or "created" for a cold start of its own).
func (s *Sandbox) Origin() (origin, acquired string) {
	if s.ColdTemplate != "" {
		return fmt.Sprintf("template %s (cold start: no warm pool serves the image)", s.ColdTemplate), "created"
	}
	var how string
	switch s.Launch {
	case LaunchWarm:
		how = "warm start"
	case LaunchCold:
		how = "cold start: the pool had no sandbox to hand out"
	case LaunchWaited:
		how = "waited for a warm sandbox"
		if s.Waited > 0 {
			how = fmt.Sprintf("waited %d ms for a warm sandbox", s.Waited.Milliseconds())
		}
	default:
		// Never a guess: a start nobody recorded is not called warm.
		return "pool " + s.Pool, "claimed"
	}
	return fmt.Sprintf("pool %s (%s)", s.Pool, how), "claimed"
}

// JobObject names what the job owns: its claim, or its cold-started Sandbox (named like the
// claim would be).
func (s *Sandbox) JobObject() string {
	if s.ColdTemplate != "" {
		return s.SandboxName
	}
	return s.Claim
}
