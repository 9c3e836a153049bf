package kube

import "fmt"

// Sandbox is a claimed job pod, verified and ready for exec: what the stages after prepare need
// to reach it. The job's state file keeps a copy (package executor), in a record of its own.
type Sandbox struct {
	Namespace   string
	Claim       string
	Pool        string
	SandboxName string
	Pod         string
	// PodUID tells the pod from a replacement of the same name.
	PodUID       string
	Container    string
	RuntimeClass string
	Warm         bool
	// ColdTemplate is set when the job owns a Sandbox cold-started from this SandboxTemplate
	// (unknown_image = "cold") instead of a claim: Claim and Pool are then empty, and cleanup
	// deletes the Sandbox SandboxName.
	ColdTemplate string
	PodIP        string
	// AgentBaked: the pod's template bakes the agent in (wire.PodAgentPath runs as the job
	// container's command, with stdin open), so its stage daemon runs from the pod's start.
	AgentBaked bool
	// Restarts is the job container's restart count when the job took the pod. A restart
	// (a memory or fork bomb ending the container, say) loses the job's processes, files and
	// the agent that runs its stages: a higher count ends the job at once.
	Restarts int32
}

// Origin says where the job's sandbox came from, for the job log ("pool duo-default (warm
// start)"), and how the job got it ("claimed", or "created" for a cold start of its own).
func (s *Sandbox) Origin() (origin, acquired string) {
	if s.ColdTemplate != "" {
		return fmt.Sprintf("template %s (cold start: no warm pool serves the image)", s.ColdTemplate), "created"
	}
	launch := "cold"
	if s.Warm {
		launch = "warm"
	}
	return fmt.Sprintf("pool %s (%s start)", s.Pool, launch), "claimed"
}

// JobObject names what the job owns: its claim, or its cold-started Sandbox (named like the
// claim would be).
func (s *Sandbox) JobObject() string {
	if s.ColdTemplate != "" {
		return s.SandboxName
	}
	return s.Claim
}
