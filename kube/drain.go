package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
)

// Annotations gc writes on a claim (or a cold-started Sandbox) whose pod is on a cordoned node.
const (
	// AnnotationDrainSeen is when gc first saw the job's pod on a cordoned node (RFC 3339); gc
	// removes it when the node is schedulable again.
	AnnotationDrainSeen = "sandbox-executor.gitlab.io/drain-seen"
	// AnnotationEnded says why gc took the job's pod away. PodGone puts it in the job log, so a
	// job that ends this way names the drain, not only a deleted pod.
	AnnotationEnded = "sandbox-executor.gitlab.io/ended"
)

// JobPod is the pod a claim (or a cold-started Sandbox) holds, and its node.
type JobPod struct {
	Name string
	UID  types.UID
	Node string
}

// JobPods are a namespace's scheduled job pods, found by what ties each to its job.
type JobPods struct {
	// byClaimUID: a pod the controller made for a claim carries the claim's UID as a label.
	byClaimUID map[types.UID]JobPod
	// bySandbox: every job pod is controlled by its Sandbox; a warm pod a claim adopted is found
	// only so, by the Sandbox the claim's status names.
	bySandbox map[string]JobPod
}

// Of is job's pod, if it is scheduled and not being deleted.
func (p JobPods) Of(job ClaimInfo) (JobPod, bool) {
	if pod, ok := p.byClaimUID[job.UID]; ok && !job.ColdStart {
		return pod, true
	}
	pod, ok := p.bySandbox[job.Sandbox]
	return pod, ok && job.Sandbox != ""
}

// JobPods lists the job pods of namespace that have a node and are not being deleted.
func (c *Claimer) JobPods(ctx context.Context, namespace string) (JobPods, error) {
	list, err := c.clients.Kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return JobPods{}, explainAPIError(err, apiCall{"list", Pods.String(), namespace, ""})
	}
	out := JobPods{byClaimUID: map[types.UID]JobPod{}, bySandbox: map[string]JobPod{}}
	for _, pod := range list.Items {
		if pod.Spec.NodeName == "" || pod.DeletionTimestamp != nil {
			continue
		}
		jp := JobPod{Name: pod.Name, UID: pod.UID, Node: pod.Spec.NodeName}
		if uid := pod.Labels[extv1beta1.SandboxIDLabel]; uid != "" {
			out.byClaimUID[types.UID(uid)] = jp
		}
		if ref := metav1.GetControllerOf(&pod); ref != nil && ref.Kind == "Sandbox" {
			out.bySandbox[ref.Name] = jp
		}
	}
	return out, nil
}

// NodeCordoned says whether node is cordoned (unschedulable), as kubectl drain leaves it.
func (c *Claimer) NodeCordoned(ctx context.Context, node string) (bool, error) {
	n, err := c.clients.Kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return false, explainAPIError(err, apiCall{"get", Nodes.String(), "", node})
	}
	return n.Spec.Unschedulable, nil
}

// MarkDrainSeen writes (at a time) or removes (zero time) AnnotationDrainSeen on the job's object.
func (c *Claimer) MarkDrainSeen(ctx context.Context, job ClaimInfo, at time.Time) error {
	var value any
	if !at.IsZero() {
		value = at.UTC().Format(time.RFC3339)
	}
	return c.annotateJobObject(ctx, job, map[string]any{AnnotationDrainSeen: value})
}

// EndJob takes the job's pod away: it writes why on the job's object (AnnotationEnded, which
// PodGone reports) and deletes the pod, if it is still the pod with that UID. A pod is deleted,
// not evicted: the running-jobs PodDisruptionBudget refuses every eviction of a job pod.
func (c *Claimer) EndJob(ctx context.Context, job ClaimInfo, pod JobPod, why string) error {
	if err := c.annotateJobObject(ctx, job, map[string]any{AnnotationEnded: why}); err != nil {
		return err
	}
	err := c.clients.Kube.CoreV1().Pods(job.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(pod.UID))})
	if err == nil || isObjectNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return explainAPIError(err, apiCall{"delete", Pods.String(), job.Namespace, pod.Name})
}

// annotateJobObject merge-patches annotations onto the claim, or the cold-started Sandbox, of
// job, naming its UID: an object that took the name since is refused (uid is immutable).
func (c *Claimer) annotateJobObject(ctx context.Context, job ClaimInfo, annotations map[string]any) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": job.UID, "annotations": annotations}})
	if err != nil {
		return err
	}
	if job.ColdStart {
		_, err = c.clients.Sandboxes.AgentsV1beta1().Sandboxes(job.Namespace).Patch(ctx, job.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		if err != nil {
			return explainAPIError(err, apiCall{"patch", Sandboxes.String(), job.Namespace, job.Name})
		}
		return nil
	}
	_, err = c.clients.Extensions.ExtensionsV1beta1().SandboxClaims(job.Namespace).Patch(ctx, job.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return explainAPIError(err, apiCall{"patch", SandboxClaims.String(), job.Namespace, job.Name})
	}
	return nil
}

// endedBy is what gc wrote on the job's object when it took the pod away (AnnotationEnded), ""
// when it did not or the object cannot be read (the pod's own state is reason enough then).
func (c *Claimer) endedBy(ctx context.Context, sbx *Sandbox) string {
	var meta metav1.Object
	switch {
	case sbx.Claim != "":
		claim, err := c.clients.Extensions.ExtensionsV1beta1().SandboxClaims(sbx.Namespace).Get(ctx, sbx.Claim, metav1.GetOptions{})
		if err != nil {
			return ""
		}
		meta = claim
	case sbx.ColdTemplate != "":
		s, err := c.clients.Sandboxes.AgentsV1beta1().Sandboxes(sbx.Namespace).Get(ctx, sbx.SandboxName, metav1.GetOptions{})
		if err != nil {
			return ""
		}
		meta = s
	default:
		return ""
	}
	return meta.GetAnnotations()[AnnotationEnded]
}

// DrainEnded is the AnnotationEnded text for a job gc ends because its node was drained.
func DrainEnded(node string, seen time.Time, timeout time.Duration) string {
	return fmt.Sprintf("node %s is being drained and this job held the drain past drain.runningJobTimeout (%s, since %s): sandbox-executor gc ended it",
		node, timeout, seen.UTC().Format(time.RFC3339))
}
