package doctor_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/version"
	fakediscovery "k8s.io/client-go/discovery/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extfake "sigs.k8s.io/agent-sandbox/clients/k8s/extensions/clientset/versioned/fake"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/stageservertest"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/operator/doctor"
	"github.com/sandbox-executor/sandbox-executor/stages"
	"github.com/sandbox-executor/sandbox-executor/stageserver"
)

const ns = "sandbox-executor"

// fixture is a healthy cluster as the chart (deploy/chart) leaves it; tests break one thing each.
type fixture struct {
	kube *kubefake.Clientset
	ext  *extfake.Clientset
	cfg  *config.Config
	// denied lists "verb resource[/sub]" that the SelfSubjectAccessReview refuses.
	denied map[string]bool
	pool   *extv1beta1.SandboxWarmPool
	tmpl   *extv1beta1.SandboxTemplate
	// netpol is the NetworkPolicy agent-sandbox makes for tmpl.
	netpol *networkingv1.NetworkPolicy
	// policy and binding hold cold starts to gVisor, as the chart's coldStart.enabled makes them.
	policy  *admissionv1.ValidatingAdmissionPolicy
	binding *admissionv1.ValidatingAdmissionPolicyBinding
}

const executorUser = "system:serviceaccount:sandbox-executor:sandbox-executor"

func newFixture(t *testing.T) *fixture {
	t.Helper()
	cfg, err := config.Parse("/etc/sandbox-executor/config.toml", []byte(`namespace = "sandbox-executor"
runner_name = "r1"
[[pool]]
name = "duo-default"
`))
	if err != nil {
		t.Fatal(err)
	}
	replicas := int32(2)
	f := &fixture{
		cfg:    cfg,
		denied: map[string]bool{},
		pool: &extv1beta1.SandboxWarmPool{
			ObjectMeta: metav1.ObjectMeta{Name: "duo-default", Namespace: ns},
			Spec:       extv1beta1.SandboxWarmPoolSpec{Replicas: &replicas, TemplateRef: extv1beta1.SandboxTemplateRef{Name: "duo-gvisor"}},
			Status:     extv1beta1.SandboxWarmPoolStatus{ReadyReplicas: 2},
		},
		tmpl: hardenedTemplate(),
		netpol: &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "duo-gvisor-network-policy", Namespace: ns, OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "extensions.agents.x-k8s.io/v1beta1", Kind: "SandboxTemplate", Name: "duo-gvisor", Controller: ptr.To(true),
			}}},
			Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}},
		},
		policy: &admissionv1.ValidatingAdmissionPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "sandbox-executor-cold-images"},
			Spec: admissionv1.ValidatingAdmissionPolicySpec{
				MatchConditions: []admissionv1.MatchCondition{{Name: "created-by-sandbox-executor", Expression: "request.userInfo.username == '" + executorUser + "'"}},
				Validations:     []admissionv1.Validation{{Expression: "has(variables.pod.runtimeClassName) && variables.pod.runtimeClassName == 'gvisor'"}},
			},
		},
		binding: &admissionv1.ValidatingAdmissionPolicyBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "sandbox-executor-cold-images"},
			Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
				PolicyName: "sandbox-executor-cold-images", ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
				MatchResources: &admissionv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}},
			},
		},
	}
	return f
}

func hardenedTemplate() *extv1beta1.SandboxTemplate {
	rc, no := "gvisor", false
	limits := corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse("2"),
		corev1.ResourceMemory:           resource.MustParse("2Gi"),
		corev1.ResourceEphemeralStorage: resource.MustParse("4Gi"),
	}
	t := &extv1beta1.SandboxTemplate{ObjectMeta: metav1.ObjectMeta{Name: "duo-gvisor", Namespace: ns}}
	t.Spec.NetworkPolicyManagement = extv1beta1.NetworkPolicyManagementManaged
	t.Spec.NetworkPolicy = &extv1beta1.NetworkPolicySpec{}
	t.Spec.PodTemplate = sandboxv1beta1.PodTemplate{Spec: corev1.PodSpec{
		RuntimeClassName:             &rc,
		AutomountServiceAccountToken: &no,
		Containers: []corev1.Container{{
			Name: "job", Image: "ci:bookworm",
			SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: &no},
			Resources:       corev1.ResourceRequirements{Limits: limits},
			Env:             []corev1.EnvVar{{Name: wire.FenceDenyEnv, Value: "169.254.169.254:80"}, {Name: wire.FenceAllowEnv, Value: "192.0.2.10:443"}},
		}},
	}}
	return t
}

func (f *fixture) checker(t *testing.T, kubelet map[string]string) *doctor.Checker {
	t.Helper()
	var extObjects []runtime.Object
	if f.pool != nil {
		extObjects = append(extObjects, f.pool)
	}
	if f.tmpl != nil {
		extObjects = append(extObjects, f.tmpl)
	}
	f.ext = extfake.NewSimpleClientset(extObjects...)
	kubeObjects := []runtime.Object{
		&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "gvisor"}, Handler: "runsc"},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}},
		// Job pods cannot run here: the kubelet check skips it.
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "control-plane"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}}}},
	}
	for _, o := range []runtime.Object{f.netpol, f.policy, f.binding} {
		if !reflect.ValueOf(o).IsNil() {
			kubeObjects = append(kubeObjects, o)
		}
	}
	f.kube = kubefake.NewSimpleClientset(kubeObjects...)
	f.kube.PrependReactor("create", "selfsubjectreviews", func(action k8stesting.Action) (bool, runtime.Object, error) {
		review := action.(k8stesting.CreateAction).GetObject().(*authenticationv1.SelfSubjectReview)
		review.Status.UserInfo.Username = executorUser
		return true, review, nil
	})
	disc := f.kube.Discovery().(*fakediscovery.FakeDiscovery)
	disc.FakedServerVersion = &version.Info{GitVersion: "v1.36.3"}
	disc.Resources = []*metav1.APIResourceList{
		{GroupVersion: "agents.x-k8s.io/v1beta1", APIResources: []metav1.APIResource{{Name: "sandboxes"}, {Name: "sandboxes/status"}}},
		{GroupVersion: "extensions.agents.x-k8s.io/v1beta1", APIResources: []metav1.APIResource{{Name: "sandboxclaims"}, {Name: "sandboxtemplates"}, {Name: "sandboxwarmpools"}}},
		{GroupVersion: "v1", APIResources: []metav1.APIResource{{Name: "pods"}}},
	}
	f.kube.PrependReactor("create", "selfsubjectaccessreviews", func(action k8stesting.Action) (bool, runtime.Object, error) {
		review := action.(k8stesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview)
		a := review.Spec.ResourceAttributes
		res := a.Resource
		if a.Subresource != "" {
			res += "/" + a.Subresource
		}
		if a.Namespace != ns {
			t.Errorf("access review in namespace %q, want %q", a.Namespace, ns)
		}
		review.Status.Allowed = !f.denied[a.Verb+" "+res]
		return true, review, nil
	})
	return &doctor.Checker{
		Config:  f.cfg,
		Clients: &kube.Clients{Kube: f.kube, Extensions: f.ext},
		Options: doctor.Options{Kubelet: kubelet != nil},
		KubeletConfigz: func(_ context.Context, node string) ([]byte, error) {
			if z, ok := kubelet[node]; ok {
				return []byte(z), nil
			}
			return nil, errors.New(`nodes "` + node + `" is forbidden`)
		},
	}
}

// forbid makes the API server refuse verb on resource to this identity.
func forbid(f *fixture, verb string, resource schema.GroupResource) {
	f.kube.PrependReactor(verb, resource.Resource, func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(resource, "", errors.New("no"))
	})
}

// line finds the result of one check.
func line(t *testing.T, results []doctor.Result, check string) doctor.Result {
	t.Helper()
	for _, r := range results {
		if r.Check == check {
			return r
		}
	}
	t.Fatalf("no %q line in:\n%s", check, render(results))
	return doctor.Result{}
}

func render(results []doctor.Result) string {
	var b strings.Builder
	for _, r := range results {
		b.WriteString(r.String() + "\n")
	}
	return b.String()
}

// expect asserts a check's status and that its line (detail and fix) mentions each of words.
func expect(t *testing.T, results []doctor.Result, check string, status doctor.Status, words ...string) {
	t.Helper()
	r := line(t, results, check)
	if r.Status != status {
		t.Errorf("%s: status %s, want %s: %s", check, r.Status, status, r)
	}
	if status != doctor.OK && r.Fix == "" {
		t.Errorf("%s: a %s line must say how to fix it: %s", check, status, r)
	}
	for _, w := range words {
		if !strings.Contains(r.String(), w) {
			t.Errorf("%s: line does not mention %q: %s", check, w, r)
		}
	}
}

func TestHealthyClusterIsAllOK(t *testing.T) {
	f := newFixture(t)
	c := f.checker(t, nil)
	var out bytes.Buffer
	env := &stages.Env{Config: f.cfg, Stdout: &out, Clients: func() (*kube.Clients, error) { return c.Clients, nil }}
	if err := doctor.Run(context.Background(), env, doctor.Options{}); err != nil {
		t.Fatalf("doctor failed on a healthy cluster: %v\n%s", err, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	// API, 4 CRDs, one line per permission, the RuntimeClass, the pool, its template and the
	// template's NetworkPolicy.
	if want := 1 + 4 + len(kube.RequiredPermissions) + 1 + 1 + 1 + 1; len(lines) != want {
		t.Errorf("%d lines, want %d:\n%s", len(lines), want, out.String())
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "ok    ") {
			t.Errorf("not ok: %s", l)
		}
	}
	for _, want := range []string{
		"ok    crd sandboxes.agents.x-k8s.io: served versions v1beta1",
		"ok    rbac create pods/exec: allowed in namespace sandbox-executor",
		"ok    runtimeclass gvisor: handler runsc",
		"ok    pool duo-default: 2 of 2 sandboxes Ready (template duo-gvisor)",
		"ok    template duo-gvisor (pool duo-default): runtimeClassName gvisor",
		"ok    networkpolicy duo-gvisor: NetworkPolicy duo-gvisor-network-policy restricts ingress and egress",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestAPIUnreachableStopsWithOneFail(t *testing.T) {
	f := newFixture(t)
	c := f.checker(t, nil)
	f.kube.PrependReactor("get", "version", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("dial tcp 10.0.0.1:6443: connect: connection refused")
	})
	results := c.Run(context.Background())
	if len(results) != 1 {
		t.Fatalf("want one line when the API server does not answer:\n%s", render(results))
	}
	expect(t, results, "kubernetes API", doctor.Fail, "connection refused", "kubeconfig")
}

// An API server that does not answer gives the exit code it gives in every verb (gc, the stages):
// a system failure, not doctor's "a check failed".
func TestAPIUnreachableIsASystemFailure(t *testing.T) {
	f := newFixture(t)
	c := f.checker(t, nil)
	f.kube.PrependReactor("get", "version", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("dial tcp 10.0.0.1:6443: connect: connection refused")
	})
	env := &stages.Env{Config: f.cfg, Stdout: io.Discard, Clients: func() (*kube.Clients, error) { return c.Clients, nil }}
	err := doctor.Run(context.Background(), env, doctor.Options{})
	if kind := failure.KindOf(err); kind != failure.KindSystem {
		t.Errorf("doctor with the API unreachable: %v, kind %v, want a system failure", err, kind)
	}
}

func TestCRDs(t *testing.T) {
	t.Run("missing", func(t *testing.T) {
		f := newFixture(t)
		c := f.checker(t, nil)
		disc := f.kube.Discovery().(*fakediscovery.FakeDiscovery)
		disc.Resources = disc.Resources[1:] // no agents.x-k8s.io group at all
		results := c.Run(context.Background())
		expect(t, results, "crd sandboxes.agents.x-k8s.io", doctor.Fail, "not served", "install agent-sandbox")
		expect(t, results, "crd sandboxclaims.extensions.agents.x-k8s.io", doctor.OK)
	})
	t.Run("old version only", func(t *testing.T) {
		f := newFixture(t)
		c := f.checker(t, nil)
		disc := f.kube.Discovery().(*fakediscovery.FakeDiscovery)
		disc.Resources[1].GroupVersion = "extensions.agents.x-k8s.io/v1alpha1"
		results := c.Run(context.Background())
		expect(t, results, "crd sandboxwarmpools.extensions.agents.x-k8s.io", doctor.Fail, "served as v1alpha1", "needs v1beta1", "upgrade")
	})
}

func TestRBACDeniedVerbFails(t *testing.T) {
	f := newFixture(t)
	f.denied["create pods/exec"] = true
	f.denied["list sandboxclaims"] = true
	results := f.checker(t, nil).Run(context.Background())
	expect(t, results, "rbac create pods/exec", doctor.Fail, "denied in namespace sandbox-executor", "the chart's Role")
	expect(t, results, "rbac list sandboxclaims.extensions.agents.x-k8s.io", doctor.Fail, "gc")
	expect(t, results, "rbac get pods/exec", doctor.OK)
	expect(t, results, "rbac create sandboxclaims.extensions.agents.x-k8s.io", doctor.OK)
}

// With unknown_image = "cold", doctor also checks the cold-start permissions (they are not in the
// default Role) and cold_template; without it, it checks neither.
func TestColdStartChecks(t *testing.T) {
	f := newFixture(t)
	f.cfg.UnknownImage, f.cfg.ColdTemplate, f.cfg.ColdImages = config.UnknownImageCold, "duo-gvisor", []string{"alpine:*"}
	f.denied["create sandboxes"] = true
	results := f.checker(t, nil).Run(context.Background())
	expect(t, results, "rbac create sandboxes.agents.x-k8s.io", doctor.Fail, "ColdStart", "coldStart.enabled=true")
	expect(t, results, "rbac delete sandboxes.agents.x-k8s.io", doctor.OK)
	expect(t, results, "template duo-gvisor (pool duo-default, cold_template)", doctor.OK, "runtimeClassName gvisor")

	f.cfg.ColdTemplate = "no-such-template"
	expect(t, f.checker(t, nil).Run(context.Background()), "template no-such-template (cold_template)", doctor.Fail, "not found", "cold_template")

	reject := newFixture(t)
	reject.denied["create sandboxes"] = true
	for _, r := range reject.checker(t, nil).Run(context.Background()) {
		if strings.Contains(r.Check, "create sandboxes") || strings.Contains(r.Check, "cold_template") {
			t.Errorf("unknown_image = reject: doctor checks %s", r.Check)
		}
	}
}

func TestRuntimeClass(t *testing.T) {
	t.Run("missing", func(t *testing.T) {
		f := newFixture(t)
		f.cfg.RuntimeClasses = []string{"gvisor", "kata"}
		results := f.checker(t, nil).Run(context.Background())
		expect(t, results, "runtimeclass gvisor", doctor.OK)
		expect(t, results, "runtimeclass kata", doctor.Fail, "not found", "runtime_classes")
	})
	t.Run("not readable", func(t *testing.T) {
		f := newFixture(t)
		c := f.checker(t, nil)
		forbid(f, "get", schema.GroupResource{Group: "node.k8s.io", Resource: "runtimeclasses"})
		expect(t, c.Run(context.Background()), "runtimeclass gvisor", doctor.Warn, "cannot verify", "ClusterRole ...-doctor")
	})
}

func TestPools(t *testing.T) {
	t.Run("missing pool fails and names it", func(t *testing.T) {
		f := newFixture(t)
		f.cfg.Pools = append(f.cfg.Pools, config.Pool{Name: "duo-node"})
		c := f.checker(t, nil)
		var out bytes.Buffer
		env := &stages.Env{Config: f.cfg, Stdout: &out, Clients: func() (*kube.Clients, error) { return c.Clients, nil }}
		err := doctor.Run(context.Background(), env, doctor.Options{})
		if failure.KindOf(err) != failure.KindPermanent || !strings.Contains(err.Error(), "1 of") {
			t.Errorf("doctor with a FAIL returned %v, want a permanent error counting the failures (exit 1)", err)
		}
		want := `FAIL  pool duo-node: SandboxWarmPool "duo-node" not found in namespace "sandbox-executor"; fix: add it to the chart's pools values (helm upgrade) or correct the [[pool]] name in /etc/sandbox-executor/config.toml`
		if !strings.Contains(out.String(), want+"\n") {
			t.Errorf("output lacks\n%s\n got:\n%s", want, out.String())
		}
		if !strings.Contains(out.String(), "ok    pool duo-default") {
			t.Errorf("the existing pool must still be checked:\n%s", out.String())
		}
	})
	t.Run("images its template runs", func(t *testing.T) {
		f := newFixture(t)
		f.cfg.Pools[0].Images = []string{"ci:bookworm", "docker.io/library/ci:bookworm"}
		expect(t, f.checker(t, nil).Run(context.Background()), "pool duo-default images", doctor.OK, "ci:bookworm, exactly")
		f.cfg.Pools[0].ServeOtherTags = true
		expect(t, f.checker(t, nil).Run(context.Background()), "pool duo-default images", doctor.OK, "and other tags of it")
	})
	t.Run("GitLab's flow image: nono", func(t *testing.T) {
		f := newFixture(t)
		flowImage := "registry.gitlab.com/gitlab-org/duo-workflow/default-docker-image/workflow-generic-image:v0.0.21"
		f.tmpl.Spec.PodTemplate.Spec.Containers[0].Image = flowImage
		f.cfg.Pools[0].Images = []string{flowImage}
		expect(t, f.checker(t, nil).Run(context.Background()), "pool duo-default nono", doctor.OK,
			"under gVisor (RuntimeClass gvisor), which implements no Landlock (google/gvisor#13439)", "duo_workflow_nono_sandbox", "keep that flag off", "docs/agent-config.md#nono")
		f = newFixture(t)
		f.cfg.Pools[0].Images = []string{"ci:bookworm"}
		for _, r := range f.checker(t, nil).Run(context.Background()) {
			if strings.HasSuffix(r.Check, " nono") {
				t.Errorf("a line about nono for a pool of another image: %s", r)
			}
		}
	})
	t.Run("an image its template does not run", func(t *testing.T) {
		f := newFixture(t)
		f.cfg.Pools[0].Images = []string{"ci:bookworm", "ci:trixie"}
		expect(t, f.checker(t, nil).Run(context.Background()), "pool duo-default images", doctor.Fail,
			"template duo-gvisor runs ci:bookworm, not ci:trixie: jobs naming those fail at prepare", "list only ci:bookworm in the pool's images")
	})
	t.Run("none ready", func(t *testing.T) {
		f := newFixture(t)
		f.pool.Status.ReadyReplicas = 0
		expect(t, f.checker(t, nil).Run(context.Background()), "pool duo-default", doctor.Warn, "0 of 2 sandboxes Ready", "describe sandboxwarmpool duo-default")
	})
	t.Run("scaled to zero", func(t *testing.T) {
		f := newFixture(t)
		zero := int32(0)
		f.pool.Spec.Replicas, f.pool.Status.ReadyReplicas = &zero, 0
		expect(t, f.checker(t, nil).Run(context.Background()), "pool duo-default", doctor.Warn, "cold start", "spec.replicas")
	})
	t.Run("template missing", func(t *testing.T) {
		f := newFixture(t)
		f.tmpl = nil
		expect(t, f.checker(t, nil).Run(context.Background()), "template duo-gvisor (pool duo-default)", doctor.Fail, "not found")
	})
}

func TestTemplateHardening(t *testing.T) {
	yes, other := true, "runc"
	cases := []struct {
		name   string
		break_ func(*extv1beta1.SandboxTemplate)
		status doctor.Status
		words  []string
	}{
		{"no runtimeClassName", func(t *extv1beta1.SandboxTemplate) { t.Spec.PodTemplate.Spec.RuntimeClassName = nil }, doctor.Fail, []string{"no runtimeClassName"}},
		{"runtimeClassName not allowed", func(t *extv1beta1.SandboxTemplate) { t.Spec.PodTemplate.Spec.RuntimeClassName = &other }, doctor.Fail, []string{"runtimeClassName runc is not in runtime_classes (gvisor)"}},
		{"privileged", func(t *extv1beta1.SandboxTemplate) {
			t.Spec.PodTemplate.Spec.Containers[0].SecurityContext.Privileged = &yes
		}, doctor.Warn, []string{"container job is privileged"}},
		{"token mounted", func(t *extv1beta1.SandboxTemplate) { t.Spec.PodTemplate.Spec.AutomountServiceAccountToken = &yes }, doctor.Warn, []string{"automountServiceAccountToken is true"}},
		{"no limits", func(t *extv1beta1.SandboxTemplate) { t.Spec.PodTemplate.Spec.Containers[0].Resources.Limits = nil }, doctor.Warn, []string{"container job has no cpu, memory, ephemeral-storage limit"}},
		{"init container without limits", func(t *extv1beta1.SandboxTemplate) {
			t.Spec.PodTemplate.Spec.InitContainers = []corev1.Container{{Name: "agent", SecurityContext: t.Spec.PodTemplate.Spec.Containers[0].SecurityContext}}
		}, doctor.Warn, []string{"container agent has no cpu, memory, ephemeral-storage limit"}},
		{"privilege escalation", func(t *extv1beta1.SandboxTemplate) { t.Spec.PodTemplate.Spec.Containers[0].SecurityContext = nil }, doctor.Warn, []string{"allows privilege escalation"}},
		{"host namespaces", func(t *extv1beta1.SandboxTemplate) { t.Spec.PodTemplate.Spec.HostNetwork = true }, doctor.Warn, []string{"node's network"}},
		{"unmanaged network policy", func(t *extv1beta1.SandboxTemplate) {
			t.Spec.NetworkPolicyManagement = extv1beta1.NetworkPolicyManagementUnmanaged
		}, doctor.Warn, []string{"Unmanaged"}},
		{"default network policy", func(t *extv1beta1.SandboxTemplate) { t.Spec.NetworkPolicy = nil }, doctor.Warn, []string{"whole internet"}},
		{"no fence check", func(t *extv1beta1.SandboxTemplate) { t.Spec.PodTemplate.Spec.Containers[0].Env = nil }, doctor.Warn, []string{"no egress fence check (SANDBOX_EXECUTOR_FENCE_DENY, SANDBOX_EXECUTOR_FENCE_ALLOW on container job)"}},
		{"baked agent without the fence's readiness probe", func(t *extv1beta1.SandboxTemplate) {
			t.Spec.PodTemplate.Spec.Containers[0].Command = []string{wire.PodAgentPath, "serve"}
		}, doctor.Warn, []string{"no readinessProbe httpGet on port 7544"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			tc.break_(f.tmpl)
			expect(t, f.checker(t, nil).Run(context.Background()), "template duo-gvisor (pool duo-default)", tc.status, tc.words...)
		})
	}
}

func TestKubeletPidsLimit(t *testing.T) {
	f := newFixture(t)
	results := f.checker(t, map[string]string{"node-a": `{"kubeletconfig":{"podPidsLimit":4096}}`}).Run(context.Background())
	expect(t, results, "pids limit node node-a", doctor.OK, "podPidsLimit 4096")
	expect(t, results, "pids limit", doctor.OK, "1 nodes not checked")

	// A template that tolerates the taint brings the node back into the check.
	f.tmpl.Spec.PodTemplate.Spec.Tolerations = []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists}}
	results = f.checker(t, map[string]string{"node-a": `{"kubeletconfig":{"podPidsLimit":4096}}`, "control-plane": `{"kubeletconfig":{}}`}).Run(context.Background())
	expect(t, results, "pids limit node control-plane", doctor.Warn, "podPidsLimit unset")
	f.tmpl.Spec.PodTemplate.Spec.Tolerations = nil

	results = f.checker(t, map[string]string{"node-a": `{"kubeletconfig":{"podPidsLimit":-1}}`}).Run(context.Background())
	expect(t, results, "pids limit node node-a", doctor.Warn, "podPidsLimit unset", "kubelet configuration")

	results = f.checker(t, map[string]string{}).Run(context.Background())
	expect(t, results, "pids limit node node-a", doctor.Fail, "forbidden", "cluster-admin")

	if results := f.checker(t, nil).Run(context.Background()); strings.Contains(render(results), "pids limit") {
		t.Errorf("the kubelet check runs only when asked:\n%s", render(results))
	}
}

// Each checked template needs the NetworkPolicy agent-sandbox makes for it, restricting egress.
func TestNetworkPolicies(t *testing.T) {
	t.Run("missing", func(t *testing.T) {
		f := newFixture(t)
		f.netpol = nil
		expect(t, f.checker(t, nil).Run(context.Background()), "networkpolicy duo-gvisor", doctor.Fail, "no NetworkPolicy for template duo-gvisor", "egress is open", "agent-sandbox controller")
	})
	t.Run("another template's", func(t *testing.T) {
		f := newFixture(t)
		f.netpol.OwnerReferences[0].Name = "other"
		expect(t, f.checker(t, nil).Run(context.Background()), "networkpolicy duo-gvisor", doctor.Fail, "no NetworkPolicy")
	})
	t.Run("ingress only", func(t *testing.T) {
		f := newFixture(t)
		f.netpol.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		expect(t, f.checker(t, nil).Run(context.Background()), "networkpolicy duo-gvisor", doctor.Fail, "does not restrict egress")
	})
	t.Run("not readable", func(t *testing.T) {
		f := newFixture(t)
		c := f.checker(t, nil)
		forbid(f, "list", schema.GroupResource{Group: "networking.k8s.io", Resource: "networkpolicies"})
		expect(t, c.Run(context.Background()), "networkpolicies", doctor.Warn, "cannot verify", "Role ...-doctor")
	})
}

// With unknown_image = "cold", a ValidatingAdmissionPolicy must hold the Sandboxes this identity
// creates to a configured RuntimeClass, bound with Deny in the namespace.
func TestColdStartAdmissionPolicy(t *testing.T) {
	const check = "admission policy (unknown_image = cold)"
	cold := func(t *testing.T) *fixture {
		f := newFixture(t)
		f.cfg.UnknownImage, f.cfg.ColdTemplate = config.UnknownImageCold, "duo-gvisor"
		return f
	}
	t.Run("in place", func(t *testing.T) {
		expect(t, cold(t).checker(t, nil).Run(context.Background()), check, doctor.OK, "policy sandbox-executor-cold-images", "Deny", executorUser, "gvisor")
	})
	t.Run("missing", func(t *testing.T) {
		f := cold(t)
		f.policy, f.binding = nil, nil
		expect(t, f.checker(t, nil).Run(context.Background()), check, doctor.Fail, "no ValidatingAdmissionPolicy holds the Sandboxes "+executorUser+" creates to gvisor", "coldStart.enabled=true")
	})
	t.Run("another release's ServiceAccount", func(t *testing.T) {
		f := cold(t)
		f.policy.Spec.MatchConditions[0].Expression = "request.userInfo.username == 'system:serviceaccount:sandbox-executor:other'"
		expect(t, f.checker(t, nil).Run(context.Background()), check, doctor.Fail, "no ValidatingAdmissionPolicy")
	})
	t.Run("another RuntimeClass", func(t *testing.T) {
		f := cold(t)
		f.policy.Spec.Validations[0].Expression = "variables.pod.runtimeClassName == 'runc'"
		expect(t, f.checker(t, nil).Run(context.Background()), check, doctor.Fail, "no ValidatingAdmissionPolicy")
	})
	t.Run("bound to another namespace", func(t *testing.T) {
		f := cold(t)
		f.binding.Spec.MatchResources.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] = "elsewhere"
		expect(t, f.checker(t, nil).Run(context.Background()), check, doctor.Fail, "policy sandbox-executor-cold-images is not bound with validationActions Deny in namespace sandbox-executor")
	})
	t.Run("only warns", func(t *testing.T) {
		f := cold(t)
		f.binding.Spec.ValidationActions = []admissionv1.ValidationAction{admissionv1.Warn}
		expect(t, f.checker(t, nil).Run(context.Background()), check, doctor.Fail, "not bound with validationActions Deny")
	})
	t.Run("not readable", func(t *testing.T) {
		f := cold(t)
		c := f.checker(t, nil)
		forbid(f, "list", schema.GroupResource{Group: "admissionregistration.k8s.io", Resource: "validatingadmissionpolicies"})
		expect(t, c.Run(context.Background()), check, doctor.Warn, "cannot verify", "ClusterRole ...-doctor")
	})
	t.Run("not checked with reject", func(t *testing.T) {
		f := newFixture(t)
		f.policy, f.binding = nil, nil
		if strings.Contains(render(f.checker(t, nil).Run(context.Background())), check) {
			t.Error("unknown_image = reject: doctor checks the cold-start policy")
		}
	})
}

// A pool's egress proxy must answer on its admin port, where the run stage reads blocked attempts.
func TestEgressProxyReachable(t *testing.T) {
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte("ok\n"))
	}))
	defer proxy.Close()
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	defer broken.Close()
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close() // nothing listens there any more

	f := newFixture(t)
	f.cfg.Pools = []config.Pool{
		{Name: "duo-default", EgressProxy: proxy.URL},
		{Name: "broken", EgressProxy: broken.URL},
		{Name: "gone", EgressProxy: gone.URL},
	}
	results := f.checker(t, nil).Run(context.Background())
	expect(t, results, "egress proxy duo-default", doctor.OK, proxy.URL+"/healthz answers")
	expect(t, results, "egress proxy broken", doctor.Fail, "503", "egressProxy.enabled")
	expect(t, results, "egress proxy gone", doctor.Fail, "admin port unreachable", "connection refused", "NetworkPolicy admits this runner")
}

func TestStageServer(t *testing.T) {
	f := newFixture(t)
	f.cfg.StageServer = filepath.Join(t.TempDir(), "run", "stages.sock")
	c := f.checker(t, nil)
	c.Version = "v2"
	expect(t, c.Run(context.Background()), "stage server", doctor.Warn, "nobody listens on "+f.cfg.StageServer, "sandbox-executor serve")

	stageservertest.Serve(t, f.cfg.StageServer, "v1", func(context.Context, stageserver.Request, io.Writer, io.Writer) int { return 0 })
	expect(t, c.Run(context.Background()), "stage server", doctor.Warn, "runs version v1, this binary is v2", "restart")
	c.Version = "v1"
	expect(t, c.Run(context.Background()), "stage server", doctor.OK, "listening on "+f.cfg.StageServer+" (version v1)")
}
