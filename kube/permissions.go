package kube

// Permission is one verb on one resource that sandbox-executor needs. The chart (deploy/chart)
// grants exactly RequiredPermissions (a unit test holds the two together), and doctor checks each
// one with a SelfSubjectAccessReview.
type Permission struct {
	// Group is the API group ("" for the core group).
	Group string
	// Resource is the plural resource, with "/subresource" where there is one ("pods/exec").
	Resource string
	Verb     string
	// Why names the command and call that need it, for doctor's fix hints and for reviewers.
	Why string
}

// String is the resource as RBAC and kubectl name it: "create sandboxclaims.extensions.agents.x-k8s.io".
func (p Permission) String() string {
	resource := p.Resource
	if p.Group != "" {
		resource += "." + p.Group
	}
	return p.Verb + " " + resource
}

// RequiredPermissions is every API call sandbox-executor makes in its namespace, one verb each.
// Add an entry here when the code makes a new call; the RBAC test then demands the Role follows.
var RequiredPermissions = []Permission{
	{SandboxWarmPools.Group, SandboxWarmPools.Resource, "get", "prepare, doctor: the pool exists (CheckPool)"},
	{SandboxWarmPools.Group, SandboxWarmPools.Resource, "list", "prepare: drained_pool = wait, the pool's state before watching (WaitPoolReady)"},
	{SandboxWarmPools.Group, SandboxWarmPools.Resource, "watch", "prepare: drained_pool = wait, until the pool has a ready sandbox (WaitPoolReady)"},
	{SandboxClaims.Group, SandboxClaims.Resource, "create", "prepare: claim a sandbox for the job (Claim)"},
	{SandboxClaims.Group, SandboxClaims.Resource, "get", "prepare: adopt a retried job's claim, re-read after a watch ends; run: load the claim; cleanup: is the claim the job's (Release)"},
	{SandboxClaims.Group, SandboxClaims.Resource, "watch", "prepare: wait for the claim to become Ready"},
	{SandboxClaims.Group, SandboxClaims.Resource, "list", "gc: this runner's claims (RunnerClaims)"},
	{SandboxClaims.Group, SandboxClaims.Resource, "delete", "cleanup, gc: release a claim (Release)"},
	{SandboxClaims.Group, SandboxClaims.Resource, "patch", "cleanup: record the job's outcome on its claim before releasing it (Release)"},
	{SandboxTemplates.Group, SandboxTemplates.Resource, "get", "doctor: check the pools' templates are hardened; prepare: unknown_image = cold, read cold_template (ColdStart)"},
	{Sandboxes.Group, Sandboxes.Resource, "get", "prepare: the claimed sandbox and its pod's name (Resolve); adopt a retried cold start; run: load a cold-started Sandbox; cleanup: is it the job's (ReleaseColdStart)"},
	{Sandboxes.Group, Sandboxes.Resource, "watch", "prepare: see the claim's sandbox adopted, a status write before the claim's Ready (watchAdoption); unknown_image = cold, wait for the Sandbox to become Ready (ColdStart)"},
	{Pods.Group, Pods.Resource, "get", "prepare: verify the pod's RuntimeClass (Resolve); run: is the pod still there (PodGone)"},
	// The exec API is a POST (SPDY, verb create) or a GET upgraded to WebSocket (verb get on
	// older API servers, create where AuthorizePodWebsocketUpgradeCreatePermission is on).
	{"", "pods/exec", "create", "prepare, run: the in-pod agent over exec"},
	{"", "pods/exec", "get", "prepare, run: the in-pod agent over exec (WebSocket)"},
	{"", "pods/log", "get", "prepare: pin a baked-in agent's key from the first line of its pod's log (ConnectAgent)"},
}

// ColdStartPermissions is what unknown_image = "cold" needs beyond RequiredPermissions: creating
// Sandboxes from a template is a wider right than claiming from a pool, so the default Role does
// not grant it. the chart grants exactly this list with coldStart.enabled (a unit test holds the two
// together), and doctor checks it only when the config sets unknown_image = "cold".
var ColdStartPermissions = []Permission{
	{Sandboxes.Group, Sandboxes.Resource, "create", "prepare: unknown_image = cold, the job's Sandbox from cold_template (ColdStart)"},
	{Sandboxes.Group, Sandboxes.Resource, "delete", "cleanup, gc: delete a cold-started Sandbox (ReleaseColdStart)"},
	{Sandboxes.Group, Sandboxes.Resource, "patch", "cleanup: record the job's outcome on its cold-started Sandbox before deleting it (ReleaseColdStart)"},
	{Sandboxes.Group, Sandboxes.Resource, "list", "gc: this runner's cold-started Sandboxes (RunnerColdStarts)"},
}

// DoctorPermissions is what doctor reads in the namespace beyond RequiredPermissions. Jobs never
// need it; without it doctor says it cannot verify the pools' NetworkPolicies, nor what their
// pods' netfence init containers found.
var DoctorPermissions = []Permission{
	{NetworkPolicies.Group, NetworkPolicies.Resource, "list", "doctor: each pool's template has its NetworkPolicy (NetworkPolicies)"},
	{Pods.Group, Pods.Resource, "list", "doctor: what the netfence init container of each pool's pods said of the runtime (Pods)"},
}

// ClusterPermissions is what doctor reads outside the namespace. Jobs never need it; without it
// doctor cannot confirm the RuntimeClasses and the cold-start admission policy exist and says so.
var ClusterPermissions = []Permission{
	{RuntimeClasses.Group, RuntimeClasses.Resource, "get", "doctor: the configured RuntimeClasses exist"},
	{AdmissionPolicies.Group, AdmissionPolicies.Resource, "list", "doctor: unknown_image = cold, the policy holding cold starts to gVisor (AdmissionPolicies)"},
	{AdmissionPolicyBindings.Group, AdmissionPolicyBindings.Resource, "list", "doctor: unknown_image = cold, the policy's binding (AdmissionPolicies)"},
}
