package chart_test

import (
	"maps"
	"strings"
	"testing"

	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/helmchart"
)

// Drains wait for running jobs: by default a PodDisruptionBudget refuses every eviction of the
// release's claimed job pods (whatever template made them), and none of its warm pods'. Another
// release's pods are not its business. drain.waitForRunningJobs false renders none.
func TestDrainsWaitForRunningJobs(t *testing.T) {
	values := `
templates:
  - {name: plain, image: ci:1, egress: none}
  - {name: other, image: ci:2, egress: none}
pools:
  - {name: p, template: plain, replicas: 1, images: ["ci:1"]}
  - {name: q, template: other, replicas: 1, images: ["ci:2"]}
executor: {defaultPool: p}
`
	objs := helmchart.Render(t, "duo", "duo-ci", values)
	pdbs := objs.OfKind("PodDisruptionBudget")
	if len(pdbs) != 1 {
		t.Fatalf("%d PodDisruptionBudgets by default, want the running jobs' one", len(pdbs))
	}
	var pdb policyv1.PodDisruptionBudget
	objs.Decode(t, "PodDisruptionBudget", pdbs[0].GetName(), &pdb)
	if pdb.Namespace != "duo-ci" || pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 0 || pdb.Spec.MinAvailable != nil {
		t.Errorf("PodDisruptionBudget %s in %q: %+v, want maxUnavailable 0 in the release's namespace", pdb.Name, pdb.Namespace, pdb.Spec)
	}
	selector, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"plain", "other"} {
		var tmpl extv1beta1.SandboxTemplate
		objs.Decode(t, "SandboxTemplate", name, &tmpl)
		pod := tmpl.Spec.PodTemplate.ObjectMeta.Labels
		// What agent-sandbox v0.5.6 puts on the pods it makes from the template: a pool's
		// sandbox carries the warm-pool label until a claim adopts it.
		warm := with(pod, sandboxv1beta1.SandboxWarmPoolLabel, "3f2a9c1b")
		claimed := with(pod, extv1beta1.SandboxIDLabel, "9b1c-claim-uid")
		otherRelease := with(claimed, "app.kubernetes.io/instance", "another")
		for _, tc := range []struct {
			what string
			pod  map[string]string
			want bool
		}{
			{"a claimed pod", claimed, true},
			{"a cold-started pod", pod, true},
			{"a warm pod", warm, false},
			{"another release's claimed pod", otherRelease, false},
		} {
			if got := selector.Matches(labels.Set(tc.pod)); got != tc.want {
				t.Errorf("template %s: %s (labels %v) covered: %v, want %v (selector %s)", name, tc.what, tc.pod, got, tc.want, selector)
			}
		}
	}

	if n := len(helmchart.Render(t, "duo", "duo-ci", "drain: {waitForRunningJobs: false}\n"+values).OfKind("PodDisruptionBudget")); n != 0 {
		t.Errorf("drain.waitForRunningJobs false: %d PodDisruptionBudgets, want none", n)
	}
	for _, bad := range []string{`"yes"`, "1", "{}"} {
		_, err := helmchart.Template(t, "duo", "duo-ci", "drain: {waitForRunningJobs: "+bad+"}\n")
		if err == nil || !strings.Contains(err.Error(), "waitForRunningJobs") {
			t.Errorf("drain.waitForRunningJobs %s: helm template said %v; want the schema to refuse it", bad, err)
		}
	}
}

// with is a copy of set with key=value added.
func with(set map[string]string, key, value string) map[string]string {
	out := maps.Clone(set)
	out[key] = value
	return out
}
