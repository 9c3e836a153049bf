package kube

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// ClaimInfo is what gc needs to know of a claim, or of a cold-started Sandbox.
type ClaimInfo struct {
	Namespace, Name, JobID string
	UID                    types.UID
	// Sandbox is the job's Sandbox: the one the claim's status names, or the cold-started one.
	Sandbox               string
	Created, ShutdownTime time.Time
	// DrainSeen is AnnotationDrainSeen's time, zero without (or unreadable).
	DrainSeen time.Time
	Deleting  bool
	// ColdStart: a Sandbox of unknown_image = "cold" (ReleaseColdStart), not a claim.
	ColdStart bool
}

func jobObjectInfo(meta metav1.ObjectMeta, shutdown *metav1.Time, coldStart bool) ClaimInfo {
	info := ClaimInfo{Namespace: meta.Namespace, Name: meta.Name, JobID: meta.Labels[LabelJobID], UID: meta.UID, Created: meta.CreationTimestamp.Time,
		Deleting: meta.DeletionTimestamp != nil, ColdStart: coldStart}
	info.DrainSeen, _ = time.Parse(time.RFC3339, meta.Annotations[AnnotationDrainSeen])
	if shutdown != nil {
		info.ShutdownTime = shutdown.Time
	}
	return info
}

// RunnerClaims lists the claims this executor made for runner.
func (c *Claimer) RunnerClaims(ctx context.Context, namespace, runner string) ([]ClaimInfo, error) {
	list, err := c.clients.Extensions.ExtensionsV1beta1().SandboxClaims(namespace).List(ctx, runnerSelector(runner))
	if err != nil {
		return nil, explainAPIError(err, apiCall{"list", SandboxClaims.String(), namespace, ""})
	}
	out := make([]ClaimInfo, 0, len(list.Items))
	for _, cl := range list.Items {
		var shutdown *metav1.Time
		if cl.Spec.Lifecycle != nil {
			shutdown = cl.Spec.Lifecycle.ShutdownTime
		}
		info := jobObjectInfo(cl.ObjectMeta, shutdown, false)
		info.Sandbox = cl.Status.SandboxStatus.Name
		out = append(out, info)
	}
	return out, nil
}

// RunnerColdStarts lists the Sandboxes this executor cold-started for runner.
func (c *Claimer) RunnerColdStarts(ctx context.Context, namespace, runner string) ([]ClaimInfo, error) {
	list, err := c.clients.Sandboxes.AgentsV1beta1().Sandboxes(namespace).List(ctx, runnerSelector(runner))
	if err != nil {
		return nil, explainAPIError(err, apiCall{"list", Sandboxes.String(), namespace, ""})
	}
	var out []ClaimInfo
	for i := range list.Items {
		if sbx := &list.Items[i]; isColdStart(sbx) {
			info := jobObjectInfo(sbx.ObjectMeta, sbx.Spec.ShutdownTime, true)
			info.Sandbox = sbx.Name
			out = append(out, info)
		}
	}
	return out, nil
}
