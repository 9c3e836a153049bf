// Package kube is everything sandbox-executor knows of Kubernetes: the clients, exec and attach,
// claims, warm pools, cold starts, the verification of a job pod, why a pod is gone, the listing
// gc reaps from, waiting for Ready, the wording of API errors, the permissions it needs and the
// cluster reads doctor makes. No other product package imports client-go.
package kube

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
)

// The resources sandbox-executor uses, named after the agent-sandbox API packages so that the
// groups are spelled in one place.
var (
	Sandboxes        = sandboxv1beta1.GroupVersion.WithResource("sandboxes").GroupResource()
	SandboxClaims    = extv1beta1.GroupVersion.WithResource("sandboxclaims").GroupResource()
	SandboxTemplates = extv1beta1.GroupVersion.WithResource("sandboxtemplates").GroupResource()
	SandboxWarmPools = extv1beta1.GroupVersion.WithResource("sandboxwarmpools").GroupResource()
	Pods             = schema.GroupResource{Resource: "pods"}
	RuntimeClasses   = schema.GroupResource{Group: "node.k8s.io", Resource: "runtimeclasses"}
	// Read by gc only: is a job pod's node cordoned (drain.runningJobTimeout).
	Nodes = schema.GroupResource{Resource: "nodes"}
	// Read by doctor only.
	NetworkPolicies         = schema.GroupResource{Group: "networking.k8s.io", Resource: "networkpolicies"}
	AdmissionPolicies       = schema.GroupResource{Group: "admissionregistration.k8s.io", Resource: "validatingadmissionpolicies"}
	AdmissionPolicyBindings = schema.GroupResource{Group: "admissionregistration.k8s.io", Resource: "validatingadmissionpolicybindings"}
)

// CRDs are the agent-sandbox resources the executor uses; APIVersion is the version its clients
// speak.
var CRDs = []schema.GroupResource{Sandboxes, SandboxClaims, SandboxTemplates, SandboxWarmPools}

// APIVersion is the agent-sandbox API version of the typed clients.
var APIVersion = sandboxv1beta1.GroupVersion.Version

// Labels put on every claim, so that operators, gc and NetworkPolicies can find a job's claim.
const (
	LabelManagedBy  = "app.kubernetes.io/managed-by"
	LabelRunner     = "sandbox-executor.gitlab.io/runner"
	LabelJobID      = "sandbox-executor.gitlab.io/job-id"
	LabelProjectID  = "sandbox-executor.gitlab.io/project-id"
	LabelPipelineID = "sandbox-executor.gitlab.io/pipeline-id"
	ManagedByValue  = "sandbox-executor"
)

// AnnotationJobBinding binds a claim, or a cold-started Sandbox, to the one job that made it: its
// value is JobBinding of that job's token. The name (ClaimName) is keyed with the token too, so
// another job meets the name only if it has no token (runners without JOB_RESPONSE_FILE, whose
// names are predictable) or someone made an object of that name: the binding is what proves an
// object is the job's, the name only where to look.
const AnnotationJobBinding = "sandbox-executor.gitlab.io/job-binding"

// AnyJob is the binding of the operator's commands (gc): they act on whatever job's object it is.
// No JobBinding is ever "*".
const AnyJob = "*"

// JobBinding is the value of AnnotationJobBinding for the job whose token (from the trusted
// JOB_RESPONSE_FILE) is token and whose object is namespace/name; empty without a token (runners
// too old to write JOB_RESPONSE_FILE), which binds to no job.
//
// It is HMAC-SHA256 keyed with the token over a versioned context and the object's identity,
// never the token: whoever may read claims in the namespace reads it. Keyed with the token, the
// value says nothing about the token (HMAC is a PRF), checking a guess costs a guess of the whole
// token, which GitLab makes at random (a plain hash would be the same, but would also give one
// token the same value on every object and in every other place that hashes it), and a value
// copied onto another object's name does not bind that one. A slow KDF would only add latency to
// every stage: the token is not a password, and it stops working when its job ends.
func JobBinding(token, namespace, name string) string {
	if token == "" {
		return ""
	}
	mac := hmac.New(sha256.New, []byte(token))
	mac.Write([]byte("sandbox-executor job binding v1\x00" + namespace + "\x00" + name))
	return "v1:" + hex.EncodeToString(mac.Sum(nil))
}

// boundTo reports whether obj carries binding (AnyJob: whatever it carries). Equal values are
// not secret, so a plain comparison is enough; hmac.Equal keeps it constant-time anyway.
func boundTo(obj metav1.Object, binding string) bool {
	return binding == AnyJob || hmac.Equal([]byte(obj.GetAnnotations()[AnnotationJobBinding]), []byte(binding))
}

// ClaimName is the name of the job's claim (and of a cold-started Sandbox): "job-", the job ID,
// "-" and 20 hex digits of an HMAC-SHA256 keyed with the job's token (CI_JOB_TOKEN, from the
// trusted JOB_RESPONSE_FILE) over the runner name and the job ID. It is deterministic for one
// job, so that a prepare the runner retries, and run and cleanup without prepare's state, find the
// claim the job made; a job of another GitLab instance or runner deployment with the same runner
// name and job ID has another token, so it gets its own name (and its own sandbox) instead of
// meeting this job's claim, and nobody without the token can predict the name. The runner name
// enters only through the HMAC, so a name of any length gives a name of at most 44 characters: a
// DNS-1123 label (claims may name cold-started pods, and the name is the job's host name).
//
// Without a token (runners too old to write JOB_RESPONSE_FILE) the key is empty: the name is
// still deterministic and distinct per runner and job, but predictable, as such jobs' claims are
// unbound (JobBinding).
func ClaimName(token, runner string, jobID int64) string {
	id := strconv.FormatInt(jobID, 10)
	mac := hmac.New(sha256.New, []byte(token))
	mac.Write([]byte("sandbox-executor claim name v1\x00" + runner + "\x00" + id))
	return "job-" + id + "-" + hex.EncodeToString(mac.Sum(nil))[:20]
}

// RunnerLabel makes a runner name fit a label value.
func RunnerLabel(runner string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(runner) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	s := b.String()
	if len(s) > 63 {
		s = s[:63]
	}
	return strings.Trim(s, "-_.")
}

// jobLabels are put on everything prepare creates for a job.
func jobLabels(job Job, runner string) map[string]string {
	labels := map[string]string{
		LabelManagedBy: ManagedByValue,
		LabelRunner:    RunnerLabel(runner),
		LabelJobID:     strconv.FormatInt(job.ID, 10),
	}
	if job.ProjectID > 0 {
		labels[LabelProjectID] = strconv.FormatInt(job.ProjectID, 10)
	}
	if job.PipelineID > 0 {
		labels[LabelPipelineID] = strconv.FormatInt(job.PipelineID, 10)
	}
	return labels
}

func runnerSelector(runner string) metav1.ListOptions {
	return metav1.ListOptions{LabelSelector: LabelManagedBy + "=" + ManagedByValue + "," + LabelRunner + "=" + RunnerLabel(runner)}
}
