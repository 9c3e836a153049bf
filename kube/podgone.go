package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PodGone explains why a pod can no longer run stages, or returns "" while it still can. When
// gc took the pod away (a drain held past its bound), the job's claim says so, and that leads.
func (c *Claimer) PodGone(ctx context.Context, sbx *Sandbox) (string, error) {
	why, err := c.podGone(ctx, sbx)
	if why == "" {
		return why, err
	}
	if ended := c.endedBy(ctx, sbx); ended != "" {
		return ended + " (" + why + ")", nil
	}
	return why, nil
}

func (c *Claimer) podGone(ctx context.Context, sbx *Sandbox) (string, error) {
	pod, err := c.clients.Kube.CoreV1().Pods(sbx.Namespace).Get(ctx, sbx.Pod, metav1.GetOptions{})
	if isObjectNotFound(err) {
		return fmt.Sprintf("pod %s/%s was deleted", sbx.Namespace, sbx.Pod), nil
	}
	if err != nil {
		return "", explainAPIError(err, apiCall{"get", Pods.String(), sbx.Namespace, sbx.Pod})
	}
	if sbx.PodUID != "" && string(pod.UID) != sbx.PodUID {
		return fmt.Sprintf("pod %s/%s was deleted and replaced by a new pod of the same name", sbx.Namespace, sbx.Pod), nil
	}
	if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning {
		return fmt.Sprintf("pod %s/%s is %s", sbx.Namespace, sbx.Pod, podState(pod)), nil
	}
	return containerGone(pod, sbx), nil
}

// containerGone explains why the job container no longer holds the job: it restarted since the
// job took the pod, or it is not running. "" while it runs as it did.
func containerGone(pod *corev1.Pod, sbx *Sandbox) string {
	cs := containerStatus(pod, sbx.Container)
	if cs == nil {
		return ""
	}
	where := fmt.Sprintf("the job container %s of pod %s/%s", sbx.Container, sbx.Namespace, sbx.Pod)
	if term := cs.State.Terminated; term != nil {
		return fmt.Sprintf("%s terminated (%s); the job's processes and files are gone%s", where, termination(term), limitHint(pod, sbx.Container, term.Reason))
	}
	if cs.RestartCount > sbx.Restarts {
		why := "restarted"
		if term := cs.LastTerminationState.Terminated; term != nil {
			why += " after " + termination(term)
			return fmt.Sprintf("%s %s; the job's processes and files are gone%s", where, why, limitHint(pod, sbx.Container, term.Reason))
		}
		return fmt.Sprintf("%s %s; the job's processes and files are gone", where, why)
	}
	if w := cs.State.Waiting; w != nil && w.Reason != "" {
		return fmt.Sprintf("%s is waiting (%s)", where, w.Reason)
	}
	return ""
}

func containerStatus(pod *corev1.Pod, name string) *corev1.ContainerStatus {
	for i := range pod.Status.ContainerStatuses {
		if pod.Status.ContainerStatuses[i].Name == name {
			return &pod.Status.ContainerStatuses[i]
		}
	}
	return nil
}

func termination(t *corev1.ContainerStateTerminated) string {
	reason := t.Reason
	if reason == "" {
		reason = "no reason given"
	}
	return fmt.Sprintf("%s, exit code %d", reason, t.ExitCode)
}

// limitHint names the limit a job ran into, so the job log says what to change.
func limitHint(pod *corev1.Pod, container, reason string) string {
	if reason != "OOMKilled" {
		return ""
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == container {
			if mem, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
				return fmt.Sprintf(": the job used more than its memory limit of %s (the SandboxTemplate's resources.limits.memory)", mem.String())
			}
		}
	}
	return ": the job ran out of memory"
}
