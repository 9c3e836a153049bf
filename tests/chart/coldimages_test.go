package chart_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	sandboxfake "sigs.k8s.io/agent-sandbox/clients/k8s/clientset/versioned/fake"
	extfake "sigs.k8s.io/agent-sandbox/clients/k8s/extensions/clientset/versioned/fake"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/helmchart"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// coldPolicy renders the cold-start policy and the cold template it holds Sandboxes to.
func coldPolicy(t *testing.T, values string) (*admissionv1.ValidatingAdmissionPolicy, *extv1beta1.SandboxTemplate) {
	t.Helper()
	objs := helmchart.Render(t, "duo", "duo-ci", "coldStart: {enabled: true, template: duo-gvisor}\nexecutor: {unknownImage: cold}\n"+values)
	return coldPolicyOf(t, objs, "duo-gvisor")
}

// coldPolicyOf is coldPolicy of a rendered release whose cold template is template.
func coldPolicyOf(t *testing.T, objs *helmchart.Objects, template string) (*admissionv1.ValidatingAdmissionPolicy, *extv1beta1.SandboxTemplate) {
	t.Helper()
	var vap admissionv1.ValidatingAdmissionPolicy
	objs.Decode(t, "ValidatingAdmissionPolicy", "duo-ci-duo-sandbox-executor-cold-images", &vap)
	var tmpl extv1beta1.SandboxTemplate
	objs.Decode(t, "SandboxTemplate", template, &tmpl)
	return &vap, &tmpl
}

// coldSandbox is the Sandbox the executor creates for a cold start from tmpl, the rendered cold
// template: kube.ColdStart's own code (its labels, owner, pod template, the job's image), run
// against fake clientsets that hold the template with a UID, and stopped at the create, which is
// where the API server's admission, these tests' subject, would run.
func coldSandbox(t *testing.T, tmpl *extv1beta1.SandboxTemplate) *sandboxv1beta1.Sandbox {
	t.Helper()
	stored := tmpl.DeepCopy()
	stored.UID = "6a1f0c2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b"
	sandboxes := sandboxfake.NewSimpleClientset()
	var created *sandboxv1beta1.Sandbox
	sandboxes.PrependReactor("create", "sandboxes", func(action k8stesting.Action) (bool, runtime.Object, error) {
		created = action.(k8stesting.CreateAction).GetObject().(*sandboxv1beta1.Sandbox).DeepCopy()
		return true, nil, errors.New("stopped at the create: the test admits what the executor sent")
	})
	clients := &kube.Clients{Kube: kubefake.NewSimpleClientset(), Sandboxes: sandboxes, Extensions: extfake.NewSimpleClientset(stored)}
	name := kube.ClaimName("glcbt-job-a-token", "duo-runner", 4242)
	req := kube.ClaimRequest{
		Namespace: stored.Namespace, Name: name, Runner: "duo-runner",
		Job:   kube.Job{ID: 4242, ProjectID: 7, PipelineID: 99, Timeout: time.Hour, Image: "registry.example.com/duo/tools/node:22"},
		Grace: 10 * time.Minute, ReadyTimeout: time.Second, RuntimeClasses: []string{"gvisor"},
		Binding: kube.JobBinding("glcbt-job-a-token", stored.Namespace, name),
	}
	if _, err := kube.NewClaimer(clients, clock.RealClock{}).ColdStart(context.Background(), req, stored.Name); created == nil {
		t.Fatalf("the executor created no Sandbox from cold template %s: %v", stored.Name, err)
	}
	return created
}

// admit evaluates the policy's own CEL expressions as the API server does for a create by
// the release's ServiceAccount: its variables in order, then every validation; an expression
// that errors denies (failurePolicy Fail). It returns the messages of the validations that deny.
func admit(t *testing.T, vap *admissionv1.ValidatingAdmissionPolicy, sbx *sandboxv1beta1.Sandbox) []string {
	t.Helper()
	return review(t, vap, nil, sbx)
}

// review is admit for an update of old to sbx (old nil: a create, whose oldObject is null).
func review(t *testing.T, vap *admissionv1.ValidatingAdmissionPolicy, old, sbx *sandboxv1beta1.Sandbox) []string {
	t.Helper()
	object, err := runtime.DefaultUnstructuredConverter.ToUnstructured(sbx)
	if err != nil {
		t.Fatal(err)
	}
	var oldObject any = types.NullValue
	if old != nil {
		if oldObject, err = runtime.DefaultUnstructuredConverter.ToUnstructured(old); err != nil {
			t.Fatal(err)
		}
	}
	// The API server's base environment (k8s.io/apiserver/pkg/cel/environment) takes only
	// homogeneous aggregate literals and compares numbers across types: an expression it would
	// not compile must not compile here either.
	env, err := cel.NewEnv(cel.Variable("object", cel.DynType), cel.Variable("oldObject", cel.DynType),
		cel.Variable("variables", cel.MapType(cel.StringType, cel.DynType)),
		cel.HomogeneousAggregateLiterals(), cel.ASTValidators(cel.ValidateHomogeneousAggregateLiterals()),
		cel.CrossTypeNumericComparisons(true), cel.OptionalTypes(), cel.DefaultUTCTimeZone(true))
	if err != nil {
		t.Fatal(err)
	}
	eval := func(expr string, variables map[string]any) (any, error) {
		ast, iss := env.Compile(expr)
		if iss.Err() != nil {
			t.Fatalf("the policy's expression %q does not compile: %v", expr, iss.Err())
		}
		prg, err := env.Program(ast)
		if err != nil {
			t.Fatal(err)
		}
		out, _, err := prg.Eval(map[string]any{"object": object, "oldObject": oldObject, "variables": variables})
		if err != nil {
			return nil, err
		}
		return out.Value(), nil
	}
	variables := map[string]any{}
	for _, v := range vap.Spec.Variables {
		value, err := eval(v.Expression, variables)
		if err != nil {
			return []string{"variable " + v.Name + ": " + err.Error()}
		}
		variables[v.Name] = value
	}
	var denied []string
	for _, v := range vap.Spec.Validations {
		if ok, err := eval(v.Expression, variables); err != nil || ok != true {
			denied = append(denied, v.Message)
		}
	}
	return denied
}

// The cold-start policy is an allow-list: the Sandbox the executor makes from the cold template
// is admitted, and each way a stolen executor token could widen a pod beyond a job's is refused
// (issue 26, finding 2).
func TestColdStartPolicyAdmitsOnlyTheColdTemplatesShape(t *testing.T) {
	for _, nonRoot := range []bool{false, true} {
		values := ""
		if nonRoot {
			values = "jobDefaults: {nonRoot: true}\n"
		}
		vap, tmpl := coldPolicy(t, values)
		if denied := admit(t, vap, coldSandbox(t, tmpl)); len(denied) > 0 {
			t.Fatalf("nonRoot %t: the executor's own cold start is refused: %q", nonRoot, denied)
		}
		// That shape includes the runner's helper, copied from the agent image by install-agent
		// into the agent's emptyDir: the policy admits it as the rest of that init container.
		bakesHelper := false
		for _, c := range coldSandbox(t, tmpl).Spec.PodTemplate.Spec.InitContainers {
			bakesHelper = bakesHelper || (c.Name == "install-agent" && slices.Contains(c.Command, "/opt/sandbox-executor/gitlab-runner-helper"))
		}
		if !bakesHelper {
			t.Errorf("nonRoot %t: the cold template's install-agent does not bake the runner's helper in", nonRoot)
		}
		for _, tc := range []struct {
			name, want string
			widen      func(*sandboxv1beta1.Sandbox)
		}{
			{"hostPath /", "emptyDir volumes only", func(s *sandboxv1beta1.Sandbox) {
				s.Spec.PodTemplate.Spec.Volumes = append(s.Spec.PodTemplate.Spec.Volumes, corev1.Volume{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
			}},
			{"a Secret volume", "emptyDir volumes only", func(s *sandboxv1beta1.Sandbox) {
				s.Spec.PodTemplate.Spec.Volumes = append(s.Spec.PodTemplate.Spec.Volumes, corev1.Volume{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "gitlab-runner-token"}}})
			}},
			{"envFrom a Secret", "may not read Secrets", func(s *sandboxv1beta1.Sandbox) {
				s.Spec.PodTemplate.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "gitlab-runner-token"}}}}
			}},
			{"env from a Secret key", "may not read Secrets", func(s *sandboxv1beta1.Sandbox) {
				s.Spec.PodTemplate.Spec.Containers[0].Env = append(s.Spec.PodTemplate.Spec.Containers[0].Env, corev1.EnvVar{Name: "T", ValueFrom: &corev1.EnvVarSource{
					SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "gitlab-runner-token"}, Key: "runner-token"}}})
			}},
			{"privileged", "may not be privileged", func(s *sandboxv1beta1.Sandbox) {
				s.Spec.PodTemplate.Spec.Containers[0].SecurityContext.Privileged = ptr.To(true)
			}},
			{"privilege escalation", "allowPrivilegeEscalation false", func(s *sandboxv1beta1.Sandbox) {
				s.Spec.PodTemplate.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = nil
			}},
			{"SYS_ADMIN added", "drop ALL capabilities", func(s *sandboxv1beta1.Sandbox) {
				caps := s.Spec.PodTemplate.Spec.Containers[0].SecurityContext.Capabilities
				caps.Add = append(caps.Add, "SYS_ADMIN")
			}},
			{"no capabilities dropped", "drop ALL capabilities", func(s *sandboxv1beta1.Sandbox) {
				s.Spec.PodTemplate.Spec.Containers[0].SecurityContext.Capabilities.Drop = nil
			}},
			{"nodeName", "may not choose their node", func(s *sandboxv1beta1.Sandbox) { s.Spec.PodTemplate.Spec.NodeName = "control-plane" }},
			{"tolerate everything", "may not choose their node", func(s *sandboxv1beta1.Sandbox) {
				s.Spec.PodTemplate.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
			}},
			{"hostPort", "host ports", func(s *sandboxv1beta1.Sandbox) {
				s.Spec.PodTemplate.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 22, HostPort: 22}}
			}},
			{"hostNetwork", "share the node's network", func(s *sandboxv1beta1.Sandbox) { s.Spec.PodTemplate.Spec.HostNetwork = true }},
			{"runc", "runtimeClassName", func(s *sandboxv1beta1.Sandbox) { s.Spec.PodTemplate.Spec.RuntimeClassName = ptr.To("runc") }},
			{"a ServiceAccount token", "automountServiceAccountToken false", func(s *sandboxv1beta1.Sandbox) {
				s.Spec.PodTemplate.Spec.AutomountServiceAccountToken = ptr.To(true)
			}},
			{"another ServiceAccount", "default ServiceAccount", func(s *sandboxv1beta1.Sandbox) { s.Spec.PodTemplate.Spec.ServiceAccountName = "duo-sandbox-executor" }},
			{"a second container", "one job container", func(s *sandboxv1beta1.Sandbox) {
				s.Spec.PodTemplate.Spec.Containers = append(s.Spec.PodTemplate.Spec.Containers, *s.Spec.PodTemplate.Spec.Containers[0].DeepCopy())
			}},
			{"an init container of another image", "init containers of the agent image only", func(s *sandboxv1beta1.Sandbox) {
				s.Spec.PodTemplate.Spec.InitContainers[0].Image = "registry.example.com/evil:1"
			}},
			{"a runner helper from an image of its own", "init containers of the agent image only", func(s *sandboxv1beta1.Sandbox) {
				install := *s.Spec.PodTemplate.Spec.InitContainers[len(s.Spec.PodTemplate.Spec.InitContainers)-1].DeepCopy()
				install.Name, install.Image = "install-helper", "registry.example.com/gitlab-runner-helper:17.9.0"
				s.Spec.PodTemplate.Spec.InitContainers = append(s.Spec.PodTemplate.Spec.InitContainers, install)
			}},
			{"a runner helper from the node", "emptyDir volumes only", func(s *sandboxv1beta1.Sandbox) {
				s.Spec.PodTemplate.Spec.Volumes = append(s.Spec.PodTemplate.Spec.Volumes, corev1.Volume{Name: "helper", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/usr/bin/gitlab-runner-helper"}}})
			}},
			{"seccomp unconfined", "unconfined by seccomp", func(s *sandboxv1beta1.Sandbox) {
				s.Spec.PodTemplate.Spec.SecurityContext.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
			}},
			{"a persistent volume claim", "persistent volumes", func(s *sandboxv1beta1.Sandbox) {
				s.Spec.VolumeClaimTemplates = []sandboxv1beta1.PersistentVolumeClaimTemplate{{}}
			}},
			{"no netstack fence", "netfence init container", func(s *sandboxv1beta1.Sandbox) {
				s.Spec.PodTemplate.Spec.InitContainers = slices.DeleteFunc(s.Spec.PodTemplate.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == "netfence" })
			}},
			{"a netstack fence that allows more", "netfence init container", func(s *sandboxv1beta1.Sandbox) {
				fence := netfenceOf(t, s)
				fence.Args = append(fence.Args, "--allow", "0.0.0.0/0:443")
			}},
			{"a netstack fence with SYS_ADMIN", "netfence init container", func(s *sandboxv1beta1.Sandbox) {
				fence := netfenceOf(t, s)
				fence.SecurityContext.Capabilities.Add = append(fence.SecurityContext.Capabilities.Add, "SYS_ADMIN")
			}},
			{"NET_ADMIN in the job container", "drop ALL capabilities", func(s *sandboxv1beta1.Sandbox) {
				caps := s.Spec.PodTemplate.Spec.Containers[0].SecurityContext.Capabilities
				caps.Add = append(caps.Add, "NET_ADMIN")
			}},
			{"pod annotations", "may not annotate", func(s *sandboxv1beta1.Sandbox) {
				s.Spec.PodTemplate.ObjectMeta.Annotations = map[string]string{"container.apparmor.security.beta.kubernetes.io/job": "unconfined"}
			}},
		} {
			sbx := coldSandbox(t, tmpl)
			tc.widen(sbx)
			denied := admit(t, vap, sbx)
			if !strings.Contains(strings.Join(denied, "\n"), tc.want) {
				t.Errorf("nonRoot %t, %s: denied by %q; want a denial saying %q", nonRoot, tc.name, denied, tc.want)
			}
		}
		if nonRoot {
			sbx := coldSandbox(t, tmpl)
			sbx.Spec.PodTemplate.Spec.SecurityContext.RunAsNonRoot = nil
			if denied := admit(t, vap, sbx); !strings.Contains(strings.Join(denied, "\n"), "runAsNonRoot") {
				t.Errorf("a root pod from a non-root cold template: denied by %q", denied)
			}
			sbx = coldSandbox(t, tmpl)
			sbx.Spec.PodTemplate.Spec.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"CHOWN"}
			if denied := admit(t, vap, sbx); len(denied) == 0 {
				t.Error("a non-root cold template's pod adding CHOWN is admitted; its template adds none")
			}
		}
	}
}

// netfenceOf is the Sandbox's netstack fence init container.
func netfenceOf(t *testing.T, s *sandboxv1beta1.Sandbox) *corev1.Container {
	t.Helper()
	for i, c := range s.Spec.PodTemplate.Spec.InitContainers {
		if c.Name == "netfence" {
			return &s.Spec.PodTemplate.Spec.InitContainers[i]
		}
	}
	t.Fatal("the cold template has no netfence init container")
	return nil
}
