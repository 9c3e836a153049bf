package executor

// Permission is one verb on one resource that sandbox-executor needs. deploy/base/rbac.yaml
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

const (
	groupExtensions = "extensions.agents.x-k8s.io"
	groupAgents     = "agents.x-k8s.io"
)

// RequiredPermissions is every API call sandbox-executor makes in its namespace, one verb each.
// Add an entry here when the code makes a new call; the RBAC test then demands the Role follows.
var RequiredPermissions = []Permission{
	{groupExtensions, "sandboxwarmpools", "get", "prepare, doctor: the pool exists (CheckPool)"},
	{groupExtensions, "sandboxwarmpools", "list", "prepare: drained_pool = wait, the pool's state before watching (WaitPoolReady)"},
	{groupExtensions, "sandboxwarmpools", "watch", "prepare: drained_pool = wait, until the pool has a ready sandbox (WaitPoolReady)"},
	{groupExtensions, "sandboxclaims", "create", "prepare: claim a sandbox for the job (Claim)"},
	{groupExtensions, "sandboxclaims", "get", "prepare: adopt a retried job's claim, re-read after a watch ends; run: load the claim"},
	{groupExtensions, "sandboxclaims", "watch", "prepare: wait for the claim to become Ready"},
	{groupExtensions, "sandboxclaims", "list", "gc: this runner's claims (RunnerClaims)"},
	{groupExtensions, "sandboxclaims", "delete", "cleanup, gc: release a claim (Release)"},
	{groupExtensions, "sandboxtemplates", "get", "doctor: check the pools' templates are hardened; prepare: unknown_image = cold, read cold_template (ColdStart)"},
	{groupAgents, "sandboxes", "get", "prepare: the claimed sandbox and its pod's name (Resolve); adopt a retried cold start; run: load a cold-started Sandbox"},
	{"", "pods", "get", "prepare: verify the pod's RuntimeClass (Resolve); run: is the pod still there (PodGone)"},
	// The exec API is a POST (SPDY, verb create) or a GET upgraded to WebSocket (verb get on
	// older API servers, create where AuthorizePodWebsocketUpgradeCreatePermission is on).
	{"", "pods/exec", "create", "prepare, run: the in-pod agent over exec"},
	{"", "pods/exec", "get", "prepare, run: the in-pod agent over exec (WebSocket)"},
	// Attach follows the same POST/WebSocket rules as exec.
	{"", "pods/attach", "create", "prepare: hand the job's token to a baked-in agent (ConnectAgent)"},
	{"", "pods/attach", "get", "prepare: hand the job's token to a baked-in agent (WebSocket)"},
}

// ColdStartPermissions is what unknown_image = "cold" needs beyond RequiredPermissions: creating
// Sandboxes from a template is a wider right than claiming from a pool, so the default Role does
// not grant it. deploy/components/cold-images grants exactly this list (a unit test holds the two
// together), and doctor checks it only when the config sets unknown_image = "cold".
var ColdStartPermissions = []Permission{
	{groupAgents, "sandboxes", "create", "prepare: unknown_image = cold, the job's Sandbox from cold_template (ColdStart)"},
	{groupAgents, "sandboxes", "watch", "prepare: unknown_image = cold, wait for the Sandbox to become Ready (ColdStart)"},
	{groupAgents, "sandboxes", "delete", "cleanup, gc: delete a cold-started Sandbox (ReleaseColdStart)"},
	{groupAgents, "sandboxes", "list", "gc: this runner's cold-started Sandboxes (RunnerColdStarts)"},
}

// ClusterPermissions is what doctor reads outside the namespace. Jobs never need it; without it
// doctor cannot confirm the RuntimeClasses exist and says so.
var ClusterPermissions = []Permission{
	{"node.k8s.io", "runtimeclasses", "get", "doctor: the configured RuntimeClasses exist"},
}
