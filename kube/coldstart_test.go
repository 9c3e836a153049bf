package kube_test

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/fakecluster"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

func coldRequest() kube.ClaimRequest {
	req := testRequest()
	req.Pool = ""
	req.Job.Image = "registry.example.com/tools/jq:1.7"
	return req
}

func TestColdStartCreatesTheJobsSandboxFromTheTemplate(t *testing.T) {
	fc := fakecluster.NewCluster(t)
	now := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	c := kube.NewClaimer(fc.Clients, testingclock.NewFakePassiveClock(now))
	got, err := c.ColdStart(context.Background(), coldRequest(), fakecluster.Template)
	if err != nil {
		t.Fatalf("ColdStart: %v", err)
	}
	name := kube.ClaimName("glcbt-job-a-token", "runner-a", 4242)
	want := kube.Sandbox{Namespace: fakecluster.Namespace, SandboxName: name, Pod: name, PodUID: "", Container: "job", Image: "registry.example.com/tools/jq:1.7",
		RuntimeClass: "gvisor", Launch: kube.LaunchCold, PodIP: fakecluster.PodIP, ColdTemplate: fakecluster.Template}
	if *got != want {
		t.Errorf("sandbox = %+v\nwant      %+v", *got, want)
	}

	sbx, err := fc.Sandboxes.AgentsV1beta1().Sandboxes(fakecluster.Namespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{kube.LabelRunner: "runner-a", kube.LabelJobID: "4242", kube.LabelProjectID: "7",
		kube.LabelPipelineID: "99", kube.LabelManagedBy: "sandbox-executor",
		sandboxv1beta1.SandboxTemplateRefHashLabel: "1161d93a", sandboxv1beta1.SandboxLaunchTypeLabel: "cold"} {
		if sbx.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, sbx.Labels[k], v)
		}
	}
	podLabels := sbx.Spec.PodTemplate.ObjectMeta.Labels
	if podLabels[sandboxv1beta1.SandboxTemplateRefHashLabel] != "1161d93a" || podLabels["app.kubernetes.io/name"] != "sandbox-executor-job" {
		t.Errorf("pod template labels %v: want the template's and its ref hash (its NetworkPolicy selects by it)", podLabels)
	}
	owner := metav1.GetControllerOf(sbx)
	if owner == nil || owner.Kind != "SandboxTemplate" || owner.Name != fakecluster.Template || owner.UID != "template-uid" {
		t.Errorf("controller = %+v, want the SandboxTemplate (agent-sandbox copies the ref-hash label to the pod only then)", owner)
	}
	if lc := sbx.Spec.Lifecycle; lc.ShutdownPolicy == nil || *lc.ShutdownPolicy != sandboxv1beta1.ShutdownPolicyDelete || !lc.ShutdownTime.Time.Equal(now.Add(70*time.Minute)) {
		t.Errorf("lifecycle = %+v, want Delete at job timeout + grace (%s)", lc, now.Add(70*time.Minute))
	}
	spec := sbx.Spec.PodTemplate.Spec
	if spec.Containers[0].Image != "registry.example.com/tools/jq:1.7" || *spec.RuntimeClassName != "gvisor" || *spec.AutomountServiceAccountToken {
		t.Errorf("pod spec: image %s, runtimeClassName %s, automount %v; want the job's image on the template's spec", spec.Containers[0].Image, *spec.RuntimeClassName, *spec.AutomountServiceAccountToken)
	}
	// Only the image, labels, binding and lifecycle come from the job: no env, no other annotations.
	for _, ctr := range spec.Containers {
		if len(ctr.Env) != 0 || len(ctr.EnvFrom) != 0 {
			t.Errorf("container %s has env: %v %v", ctr.Name, ctr.Env, ctr.EnvFrom)
		}
	}
	if len(sbx.Annotations) != 2 || sbx.Annotations[sandboxv1beta1.SandboxTemplateRefAnnotation] != fakecluster.Template || sbx.Annotations[kube.AnnotationJobBinding] != coldRequest().Binding {
		t.Errorf("annotations %v, want only the template ref and the job's binding", sbx.Annotations)
	}
	tmpl, _ := fc.Extensions.ExtensionsV1beta1().SandboxTemplates(fakecluster.Namespace).Get(context.Background(), fakecluster.Template, metav1.GetOptions{})
	if tmpl.Spec.PodTemplate.Spec.Containers[0].Image != "ci:bookworm" {
		t.Error("ColdStart changed the template's own spec")
	}
}

func TestColdStartAdoptsItsOwnSandboxOnRetry(t *testing.T) {
	fc := fakecluster.NewCluster(t)
	c := fc.Claimer()
	first := assertRetryAdopts(t, func() (*kube.Sandbox, error) {
		return c.ColdStart(context.Background(), coldRequest(), fakecluster.Template)
	}, func() int {
		list, _ := fc.Sandboxes.AgentsV1beta1().Sandboxes(fakecluster.Namespace).List(context.Background(), metav1.ListOptions{})
		return len(list.Items)
	})
	// run without prepare's state file finds it by name.
	found, err := c.Find(context.Background(), fakecluster.Namespace, first.SandboxName, coldRequest().Binding, []string{"gvisor"})
	if err != nil || *found != *first {
		t.Errorf("Find = %+v, %v; want %+v", found, err, first)
	}
}

func TestColdStartRefusesAnotherJobsSandbox(t *testing.T) {
	fc := fakecluster.NewCluster(t)
	name := kube.ClaimName("glcbt-job-a-token", "runner-a", 4242)
	other := &sandboxv1beta1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: fakecluster.Namespace, Labels: map[string]string{kube.LabelJobID: "1"}}}
	if _, err := fc.Sandboxes.AgentsV1beta1().Sandboxes(fakecluster.Namespace).Create(context.Background(), other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := fc.Claimer().ColdStart(context.Background(), coldRequest(), fakecluster.Template)
	if failure.KindOf(err) != failure.KindPermanent || !strings.Contains(err.Error(), "Sandbox sandbox-executor/"+name+" exists but belongs to another job") {
		t.Errorf("err = %v, want a permanent refusal", err)
	}
}

func TestColdStartFailsClosedOnRuntimeClass(t *testing.T) {
	for _, rc := range []string{"", "runc"} {
		fc := fakecluster.NewCluster(t)
		fc.RuntimeClass = rc
		_, err := fc.Claimer().ColdStart(context.Background(), coldRequest(), fakecluster.Template)
		if failure.KindOf(err) != failure.KindPermanent || !strings.Contains(err.Error(), "refusing pod") || !strings.Contains(err.Error(), "SandboxTemplate duo-gvisor (cold_template)") {
			t.Errorf("runtimeClass %q: err = %v, want a permanent refusal naming cold_template", rc, err)
		}
	}
}

func TestColdStartErrorsAreExplained(t *testing.T) {
	denied := apierrors.NewForbidden(schema.GroupResource{Group: "agents.x-k8s.io", Resource: "sandboxes"}, "", nil)
	forbidden := func(verb, resource string) func(fc *fakecluster.Cluster) {
		return func(fc *fakecluster.Cluster) {
			if verb == "watch" { // watches have a reaction chain of their own
				fc.Sandboxes.PrependWatchReactor(resource, func(k8stesting.Action) (bool, watch.Interface, error) { return true, nil, denied })
				return
			}
			fc.Sandboxes.PrependReactor(verb, resource, func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, denied })
		}
	}
	for _, tc := range []struct {
		name     string
		template string
		break_   func(fc *fakecluster.Cluster)
		kind     failure.Kind
		want     string
	}{
		{"template missing", "no-such-template", nil, failure.KindPermanent, `SandboxTemplate "no-such-template" not found in namespace "sandbox-executor": create it or fix cold_template`},
		{"create denied", fakecluster.Template, forbidden("create", "sandboxes"), failure.KindPermanent, "RBAC denied: cannot create sandboxes.agents.x-k8s.io in namespace sandbox-executor"},
		{"watch denied", fakecluster.Template, forbidden("watch", "sandboxes"), failure.KindPermanent, "RBAC denied: cannot watch sandboxes.agents.x-k8s.io"},
		{"pod failed", fakecluster.Template, func(fc *fakecluster.Cluster) { fc.ReadyReason = sandboxv1beta1.SandboxReasonPodFailed }, failure.KindPermanent, "cannot become Ready: Ready=False reason=PodFailed"},
		{"not ready in time", fakecluster.Template, func(fc *fakecluster.Cluster) { fc.ReadyReason = "DependenciesNotReady" }, failure.KindSystem, "(cold start from template duo-gvisor) not Ready within ready_timeout 300ms; last condition: Ready=False reason=DependenciesNotReady"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc := fakecluster.NewCluster(t)
			if tc.break_ != nil {
				tc.break_(fc)
			}
			req := coldRequest()
			req.ReadyTimeout = 300 * time.Millisecond
			_, err := fc.Claimer().ColdStart(context.Background(), req, tc.template)
			if failure.KindOf(err) != tc.kind || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("err = %v (kind %d), want one line of kind %d containing %q", err, failure.KindOf(err), tc.kind, tc.want)
			}
		})
	}
}

// The values agent-sandbox v0.5.6 put on the local cluster's templates (their
// agents.x-k8s.io/sandbox-template-ref-hash label) and NetworkPolicies' pod selectors.
func TestTemplateRefHashIsAgentSandboxs(t *testing.T) {
	for template, want := range map[string]string{"duo-gvisor": "1161d93a", "posix-gvisor": "41370e93", "duo-gvisor-proxied": "317f471a"} {
		if got := kube.TemplateRefHash(template); got != want {
			t.Errorf("TemplateRefHash(%q) = %s, want %s", template, got, want)
		}
	}
}
