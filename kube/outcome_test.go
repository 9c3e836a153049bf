package kube_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/fakecluster"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// Release writes the job's outcome on its claim, naming the claim's UID, and only then deletes
// it: the exporter sees the outcome in the claim's last update before it goes. An unknown outcome
// (gc) writes nothing.
func TestReleaseRecordsTheOutcomeBeforeTheDelete(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		outcome kube.Outcome
		patched bool
	}{
		{"failure", kube.Outcome{Result: kube.OutcomeFailed, Reason: kube.ReasonScript}, true},
		{"success", kube.Outcome{Result: kube.OutcomeSuccess}, true},
		{"unknown", kube.Outcome{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc := fakecluster.NewCluster(t)
			c := fc.Claimer()
			req := testRequest()
			sbx, err := c.Claim(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			fc.WaitClaimStatus(t, sbx.Claim)
			// The fake API server gives objects no UID; the real one always does.
			claims := fc.Extensions.ExtensionsV1beta1().SandboxClaims(sbx.Namespace)
			claim, err := claims.Get(ctx, sbx.Claim, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			claim.UID = "claim-uid"
			if _, err := claims.Update(ctx, claim, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			fc.Extensions.ClearActions()
			if err := c.Release(ctx, sbx.Namespace, sbx.Claim, req.Binding, tc.outcome); err != nil {
				t.Fatal(err)
			}
			var verbs []string
			var patch map[string]map[string]any
			for _, a := range fc.Extensions.Actions() {
				verbs = append(verbs, a.GetVerb())
				if p, ok := a.(k8stesting.PatchAction); ok {
					if err := json.Unmarshal(p.GetPatch(), &patch); err != nil {
						t.Fatal(err)
					}
				}
			}
			want := "[get delete]"
			if tc.patched {
				want = "[get patch delete]"
			}
			if got := fmt.Sprint(verbs); got != want {
				t.Fatalf("calls %s, want %s", got, want)
			}
			if !tc.patched {
				return
			}
			annotations := patch["metadata"]["annotations"].(map[string]any)
			if annotations[kube.AnnotationOutcome] != tc.outcome.Result || tc.outcome.Reason != "" && annotations[kube.AnnotationFailureReason] != tc.outcome.Reason {
				t.Errorf("patch annotations %v, want outcome %+v", annotations, tc.outcome)
			}
			if patch["metadata"]["uid"] != "claim-uid" {
				t.Errorf("patch %v does not name the claim's UID", patch)
			}
		})
	}
}
