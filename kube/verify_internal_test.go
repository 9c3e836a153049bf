package kube

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
)

func TestVerifyPodOwnership(t *testing.T) {
	rc := "gvisor"
	yes := true
	pod := func(claimLabel, controller string) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Labels: map[string]string{}},
			Spec:       corev1.PodSpec{RuntimeClassName: &rc, Containers: []corev1.Container{{Name: "job"}}},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning},
		}
		if claimLabel != "" {
			p.Labels[extv1beta1.SandboxIDLabel] = claimLabel
		}
		if controller != "" {
			p.OwnerReferences = []metav1.OwnerReference{{Kind: "Sandbox", Name: "s", UID: types.UID("sandbox-" + controller), Controller: &yes}}
		}
		return p
	}
	claimed := podOwner{claimUID: "claim-1", sandboxUID: "sandbox-1"}
	unadopted := podOwner{claimUID: "claim-1"} // the Sandbox is not controlled by the claim
	cold := podOwner{coldStart: true, sandboxUID: "sandbox-1"}
	for _, c := range []struct {
		name  string
		pod   *corev1.Pod
		owner podOwner
		err   string
	}{
		{"labelled with its claim", pod("claim-1", ""), claimed, ""},
		{"labelled with another claim", pod("claim-2", "1"), claimed, "belongs to another claim"},
		// The finding: a pod with no claim label was accepted as the claim's.
		{"no claim label, no controller", pod("", ""), claimed, "carries no claim label"},
		{"no claim label, another Sandbox's", pod("", "2"), claimed, "carries no claim label"},
		{"no claim label, the claim's Sandbox not adopted", pod("", "1"), unadopted, "carries no claim label"},
		{"not relabelled yet after adoption", pod("", "1"), claimed, ""},
		{"cold start, its Sandbox's", pod("", "1"), cold, ""},
		{"cold start, a claim's", pod("claim-1", "1"), cold, "is not the pod of the job's Sandbox"},
		{"cold start, no controller", pod("", ""), cold, "is not the pod of the job's Sandbox"},
	} {
		err := verifyPod(c.pod, c.owner, []string{rc})
		if (c.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: verifyPod = %v; want %q", c.name, err, c.err)
		}
	}
}
