package kube

import (
	"context"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/failure"
)

// podRead is a pod read ahead, by the name its Sandbox most likely gives it.
type podRead struct {
	pod *corev1.Pod
	err error
}

// verifiedSandbox reads the sandbox's pod (or takes ahead's, when that is the pod the Sandbox
// names), refuses it unless verifyPod passes, and describes it.
func (c *Claimer) verifiedSandbox(ctx context.Context, sbx *sandboxv1beta1.Sandbox, ahead *podRead, owner podOwner, runtimeClasses []string) (*Sandbox, error) {
	ns := sbx.Namespace
	podName := PodNameOf(sbx)
	var pod *corev1.Pod
	var err error
	if ahead != nil && podName == sbx.Name {
		pod, err = ahead.pod, ahead.err
	} else {
		pod, err = c.clients.Kube.CoreV1().Pods(ns).Get(ctx, podName, metav1.GetOptions{})
	}
	if err != nil {
		return nil, explainAPIError(err, apiCall{"get", Pods.String(), ns, podName})
	}
	if err := verifyPod(pod, owner, runtimeClasses); err != nil {
		return nil, err
	}
	out := &Sandbox{
		Namespace:    ns,
		SandboxName:  sbx.Name,
		Pod:          pod.Name,
		PodUID:       string(pod.UID),
		Container:    pod.Spec.Containers[0].Name,
		Image:        pod.Spec.Containers[0].Image,
		RuntimeClass: *pod.Spec.RuntimeClassName,
		PodIP:        pod.Status.PodIP,
		AgentBaked:   agentBaked(&pod.Spec.Containers[0]),
	}
	if cs := containerStatus(pod, out.Container); cs != nil {
		out.Restarts = cs.RestartCount
	}
	return out, nil
}

// PodNameOf is the name of the Sandbox's pod: the one its annotation names, else the Sandbox's own
// (agent-sandbox names the pod after the Sandbox unless it adopted a pod of another name).
func PodNameOf(sbx *sandboxv1beta1.Sandbox) string {
	if name := sbx.Annotations[sandboxv1beta1.SandboxPodNameAnnotation]; name != "" {
		return name
	}
	return sbx.Name
}

// agentBaked: the job container runs the agent the template baked in (its "serve").
func agentBaked(c *corev1.Container) bool {
	return len(c.Command) > 0 && c.Command[0] == wire.PodAgentPath
}

// podOwner is what a job pod must belong to, and the template that decides its isolation.
type podOwner struct {
	// claimUID: a claimed pod is labelled with its claim's UID.
	claimUID types.UID
	// coldStart: there is no claim; the pod is controlled by the job's own Sandbox sandboxUID
	// and labelled with no claim.
	coldStart bool
	// sandboxUID is the Sandbox whose pod it must be: the job's own (cold start) or the one its
	// claim adopted.
	sandboxUID types.UID
	// template names the template to fix, for the refusal: "the SandboxTemplate of pool x".
	template string
}

// verifyPod is the fail-closed gate: no script runs in a pod that is not isolated as configured.
func verifyPod(pod *corev1.Pod, owner podOwner, runtimeClasses []string) error {
	rc := ""
	if pod.Spec.RuntimeClassName != nil {
		rc = *pod.Spec.RuntimeClassName
	}
	if !slices.Contains(runtimeClasses, rc) {
		shown := rc
		if shown == "" {
			shown = "none (the node's default runtime)"
		}
		return failure.PermanentError(nil, "refusing pod %s/%s: runtimeClassName is %s, allowed: %s; fix %s",
			pod.Namespace, pod.Name, shown, strings.Join(runtimeClasses, ", "), owner.template)
	}
	claimUID := pod.Labels[extv1beta1.SandboxIDLabel]
	controlledBySandbox := false
	if ref := metav1.GetControllerOf(pod); ref != nil && owner.sandboxUID != "" {
		controlledBySandbox = ref.UID == owner.sandboxUID
	}
	switch {
	case owner.coldStart:
		if claimUID != "" || !controlledBySandbox {
			return failure.SystemError(nil, "pod %s/%s is not the pod of the job's Sandbox", pod.Namespace, pod.Name)
		}
	case claimUID == "" && !controlledBySandbox:
		// A claimed pod carries its claim's UID. Right after adoption the Sandbox controller may
		// not have relabelled it yet: then it must be the pod of the Sandbox the claim adopted.
		return failure.SystemError(nil, "pod %s/%s carries no claim label (%s) and is not the pod of the claim's Sandbox", pod.Namespace, pod.Name, extv1beta1.SandboxIDLabel)
	case claimUID != "" && claimUID != string(owner.claimUID):
		return failure.SystemError(nil, "pod %s/%s belongs to another claim", pod.Namespace, pod.Name)
	}
	if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning {
		return failure.SystemError(nil, "pod %s/%s is %s, not Running", pod.Namespace, pod.Name, podState(pod))
	}
	if len(pod.Spec.Containers) == 0 {
		return failure.PermanentError(nil, "pod %s/%s has no containers", pod.Namespace, pod.Name)
	}
	return nil
}

func podState(pod *corev1.Pod) string {
	if pod.DeletionTimestamp != nil {
		return "being deleted"
	}
	if pod.Status.Reason != "" {
		state := string(pod.Status.Phase) + " (" + pod.Status.Reason
		if pod.Status.Message != "" {
			// An eviction says which limit the job ran into.
			state += ": " + failure.OneLine(pod.Status.Message)
		}
		return state + ")"
	}
	return string(pod.Status.Phase)
}
