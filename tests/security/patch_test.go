//go:build security

package security

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	extclient "sigs.k8s.io/agent-sandbox/clients/k8s/extensions/clientset/versioned"

	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
)

// TestExecutorPatchesOnlyAnnotations: the executor's ServiceAccount may patch its job's claim to
// record the outcome, and nothing else through that right: a patch of the claim's spec (its
// lifetime, its pool), its labels or its job binding is refused by the chart's admission policy.
// Server-side dry runs: nothing is changed.
func TestExecutorPatchesOnlyAnnotations(t *testing.T) {
	t.Parallel()
	c := clusterjobs.Connect(t)
	r := c.NewRunner(t, "sec-patch", "")
	j := prepared(t, r, clusterjobs.JobSpec{})
	claims := extclient.NewForConfigOrDie(clusterjobs.RESTConfig(t, c.ExecutorKubeconfig())).ExtensionsV1beta1().SandboxClaims(clusterjobs.Namespace)
	dryRun := metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}
	patch := func(body string) error {
		_, err := claims.Patch(context.Background(), j.ClaimName(), types.MergePatchType, []byte(body), dryRun)
		return err
	}
	if err := patch(fmt.Sprintf(`{"metadata":{"annotations":{%q:"success"}}}`, kube.AnnotationOutcome)); err != nil {
		t.Errorf("recording the outcome: %v; want it allowed", err)
	}
	later := time.Now().Add(48 * time.Hour).UTC().Format(time.RFC3339)
	for what, body := range map[string]string{
		"the claim's lifetime": fmt.Sprintf(`{"spec":{"lifecycle":{"shutdownTime":%q}}}`, later),
		"the claim's pool":     `{"spec":{"warmPoolRef":{"name":"duo-proxied"}}}`,
		"the claim's labels":   fmt.Sprintf(`{"metadata":{"labels":{%q:"another-runner"}}}`, kube.LabelRunner),
		"the job binding":      fmt.Sprintf(`{"metadata":{"annotations":{%q:"v1:forged"}}}`, kube.AnnotationJobBinding),
	} {
		err := patch(body)
		switch {
		case err == nil:
			t.Errorf("patching %s: allowed; want it refused", what)
		case !strings.Contains(err.Error(), "sandbox-executor may") && what != "the claim's pool":
			// The pool may also be immutable in agent-sandbox's own schema, which answers first.
			t.Errorf("patching %s: %v; want it refused by the annotations-only policy", what, err)
		}
	}
}
