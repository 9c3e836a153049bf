package kube

import (
	"context"
	"encoding/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// How a job ended, as cleanup records it on the job's claim (or cold-started Sandbox) just before
// releasing it, for the exporter: two short, non-secret annotations from fixed vocabularies.
const (
	AnnotationOutcome       = "sandbox-executor.gitlab.io/outcome"
	AnnotationFailureReason = "sandbox-executor.gitlab.io/failure-reason"
)

// Outcome values (Outcome.Result).
const (
	OutcomeSuccess  = "success"
	OutcomeFailed   = "failed"
	OutcomeCanceled = "canceled"
)

// Failure reasons (Outcome.Reason), one per way a job fails that an operator acts on differently.
const (
	// ReasonScript: the job's own script exited non-zero. Not the platform's problem.
	ReasonScript = "script_failure"
	// ReasonSystem: an infrastructure failure in a stage (pod gone, API unreachable, a stage whose
	// exit status could not be established).
	ReasonSystem = "system_failure"
	// ReasonPermanent: a failure no retry fixes (bad config, RBAC, an image no pool serves).
	ReasonPermanent = "permanent_failure"
	// ReasonPrepare: prepare did not finish (claim timed out, agent not reachable, ...).
	ReasonPrepare = "prepare_failed"
	// ReasonFence: the pod's egress fence did not hold, so prepare released the claim.
	ReasonFence = "fence_not_holding"
	// ReasonTimeout: the job ran past its timeout (GitLab's failure reason of the same name).
	ReasonTimeout = "job_execution_timeout"
)

// Outcome is how a job ended. The zero Outcome is unknown and is not recorded.
type Outcome struct {
	Result string `json:"result,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// OutcomeOf reads the outcome recorded on obj; the zero Outcome if none was.
func OutcomeOf(obj metav1.Object) Outcome {
	a := obj.GetAnnotations()
	return Outcome{Result: a[AnnotationOutcome], Reason: a[AnnotationFailureReason]}
}

// recordOutcome writes outcome on got, the job's object just read, with a merge patch that
// names got's UID: an object that took the name since is refused by the API server (uid is
// immutable). It is bookkeeping for metrics: a failed write never costs cleanup its release, so
// its error is dropped and the exporter counts one job fewer.
func recordOutcome[T metav1.Object](ctx context.Context, client getDeleter[T], got T, outcome Outcome) {
	if outcome.Result == "" || OutcomeOf(got) == outcome {
		return
	}
	annotations := map[string]any{AnnotationOutcome: outcome.Result, AnnotationFailureReason: nil}
	if outcome.Reason != "" {
		annotations[AnnotationFailureReason] = outcome.Reason
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": got.GetUID(), "annotations": annotations}})
	if err != nil {
		return
	}
	_, _ = client.Patch(ctx, got.GetName(), types.MergePatchType, patch, metav1.PatchOptions{})
}
