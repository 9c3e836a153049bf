package kube

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
)

// Only a sandbox the claim controls, labelled with its UID, Ready and not being deleted counts
// as handed over: a label alone (anyone who may patch Sandboxes can set one) or a Sandbox still
// booting does not.
func TestAdoptedAndReady(t *testing.T) {
	claim := &extv1beta1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Name: "job-1", UID: "claim-uid"}}
	yes := true
	adopted := func(edit func(*sandboxv1beta1.Sandbox)) *sandboxv1beta1.Sandbox {
		s := &sandboxv1beta1.Sandbox{ObjectMeta: metav1.ObjectMeta{
			Name:            "pool-abcde",
			Labels:          map[string]string{extv1beta1.SandboxIDLabel: "claim-uid"},
			OwnerReferences: []metav1.OwnerReference{{Kind: "SandboxClaim", Name: "job-1", UID: "claim-uid", Controller: &yes}},
		}}
		s.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue}}
		if edit != nil {
			edit(s)
		}
		return s
	}
	now := metav1.Now()
	for _, tc := range []struct {
		name string
		sbx  *sandboxv1beta1.Sandbox
		want bool
	}{
		{"adopted and Ready", adopted(nil), true},
		{"label only, controlled by the pool", adopted(func(s *sandboxv1beta1.Sandbox) {
			s.OwnerReferences = []metav1.OwnerReference{{Kind: "SandboxWarmPool", Name: "pool", UID: "pool-uid", Controller: &yes}}
		}), false},
		{"controlled by another claim", adopted(func(s *sandboxv1beta1.Sandbox) { s.OwnerReferences[0].UID = "other" }), false},
		{"not labelled yet", adopted(func(s *sandboxv1beta1.Sandbox) { s.Labels = nil }), false},
		{"still booting", adopted(func(s *sandboxv1beta1.Sandbox) { s.Status.Conditions[0].Status = metav1.ConditionFalse }), false},
		{"no Ready condition", adopted(func(s *sandboxv1beta1.Sandbox) { s.Status.Conditions = nil }), false},
		{"being deleted", adopted(func(s *sandboxv1beta1.Sandbox) { s.DeletionTimestamp = &now }), false},
	} {
		if got := adoptedAndReady(tc.sbx, claim); got != tc.want {
			t.Errorf("%s: adoptedAndReady = %t, want %t", tc.name, got, tc.want)
		}
	}
}
