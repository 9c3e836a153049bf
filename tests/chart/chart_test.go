package chart_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/egress"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/helmchart"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
	"github.com/sandbox-executor/sandbox-executor/operator/doctor"
)

// The value sets a user is likely to install with; every invariant below holds for each.
var valueSets = []struct {
	name, release, namespace, values string
}{
	{"defaults", "sandbox-executor", "sandbox-executor", ""},
	{"another namespace", "ci", "ci-sandbox", ""},
	{"egress proxy and cold starts", "duo", "duo-ci", `
egressProxy: {enabled: true, allow: ["gitlab.example.com", "registry.npmjs.org:443"]}
gitlab: {cidrs: [192.0.2.10/32]}
coldStart: {enabled: true, template: duo-gvisor, images: ["registry.example.com/duo/tools/*:*"]}
executor: {unknownImage: cold}
images: {tag: v1.2.3}
templates:
  - {name: duo-gvisor, image: "registry.example.com/duo/ci:bookworm"}
  - {name: duo-gvisor-proxied, image: "registry.example.com/duo/ci:bookworm", egress: proxied}
pools:
  - {name: duo-default, template: duo-gvisor, replicas: 2, images: ["registry.example.com/duo/ci:bookworm"]}
  - {name: duo-proxied, template: duo-gvisor-proxied, replicas: 1, images: ["registry.example.com/duo/ci-proxied:bookworm"], serveOtherTags: true}
`},
	{"existing RuntimeClass and non-root jobs", "sandbox-executor", "gke-ci", `
runtimeClass: {create: false, name: gvisor}
jobDefaults: {nonRoot: true}
`},
	{"the local cluster", "sandbox-executor", "sandbox-executor", localValues()},
	{"GitLab's default flow images", "duo", "duo-flows", chartFile("values-duo-flow.yaml")},
	{"monitoring and autoscaling", "ci", "ci-sandbox", `
exporter: {enabled: true}
metricsAdapter: {enabled: true}
pools:
  - {name: duo-default, template: duo-gvisor, replicas: 2, images: ["registry.example.com/duo/ci:bookworm"], autoscaling: {maxReplicas: 8}}
`},
}

// kubernetesOwn are the roles and identities of Kubernetes itself that the metrics adapter's
// bindings name, as every extension API server's do: delegated authentication and
// authorization, the front proxy's CA (readable in kube-system only), and the HPA controller,
// which reads the External metrics. TestMetricsAdapter checks each binding.
var kubernetesOwn = []string{
	"ClusterRole/system:auth-delegator",
	"Role/extension-apiserver-authentication-reader",
	"ServiceAccount/kube-system/horizontal-pod-autoscaler",
}

// chartFile is a values file shipped with the chart.
func chartFile(name string) string {
	root, err := testutil.ModuleRoot()
	if err != nil {
		panic(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "deploy", "chart", "sandbox-executor", name))
	if err != nil {
		panic(err)
	}
	return string(b)
}

func localValues() string {
	root, err := testutil.ModuleRoot()
	if err != nil {
		panic(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "deploy", "local", "values.yaml"))
	if err != nil {
		panic(err)
	}
	return string(b) + "\nimages: {agent: sandbox-executor.local/sandbox-executor-agent:0123abcd}\n"
}

// egressAdminToken is where runner and proxy pods read the admin API's token (issue 26.6).
const egressAdminToken = "/etc/sandbox-executor/egress-admin/token"

var clusterScoped = []string{"Namespace", "RuntimeClass", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "APIService"}

// authReaderBinding is the metrics adapter's RoleBinding in kube-system, the one namespaced
// object of the chart outside the release's namespace.
func authReaderBinding(u unstructured.Unstructured) bool {
	ref, _, _ := unstructured.NestedString(u.Object, "roleRef", "name")
	return u.GetKind() == "RoleBinding" && u.GetNamespace() == "kube-system" && ref == "extension-apiserver-authentication-reader"
}

func TestHelmLint(t *testing.T) {
	out, err := exec.Command(helmchart.Helm(t), "lint", "--strict", helmchart.Chart(t)).CombinedOutput()
	if err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
}

// Everything follows the release's namespace: each namespaced object lives there, and every
// binding names ServiceAccounts of that namespace that the chart creates.
func TestEverythingFollowsTheReleaseNamespace(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			objs := helmchart.Render(t, vs.release, vs.namespace, vs.values)
			for _, u := range objs.Items {
				if slices.Contains(clusterScoped, u.GetKind()) {
					continue
				}
				if u.GetNamespace() != vs.namespace && !authReaderBinding(u) {
					t.Errorf("%s %s is in namespace %q, want %q", u.GetKind(), u.GetName(), u.GetNamespace(), vs.namespace)
				}
			}
			for _, kind := range []string{"RoleBinding", "ClusterRoleBinding"} {
				for _, u := range objs.OfKind(kind) {
					var b rbacv1.RoleBinding
					objs.Decode(t, kind, u.GetName(), &b)
					if objs.Find(b.RoleRef.Kind, b.RoleRef.Name) == nil && !slices.Contains(kubernetesOwn, b.RoleRef.Kind+"/"+b.RoleRef.Name) {
						t.Errorf("%s %s binds %s %s, which the chart does not create", kind, b.Name, b.RoleRef.Kind, b.RoleRef.Name)
					}
					for _, s := range b.Subjects {
						if slices.Contains(kubernetesOwn, s.Kind+"/"+s.Namespace+"/"+s.Name) {
							continue
						}
						if s.Kind != "ServiceAccount" || s.Namespace != vs.namespace || objs.Find("ServiceAccount", s.Name) == nil {
							t.Errorf("%s %s binds %s %s/%s: want a ServiceAccount of this release in %s", kind, b.Name, s.Kind, s.Namespace, s.Name, vs.namespace)
						}
					}
				}
			}
			cfg := executorConfig(t, objs, vs.release)
			if cfg.Namespace != vs.namespace || cfg.Kubeconfig != "" {
				t.Errorf("executor config: namespace %q, kubeconfig %q; want %q and the in-cluster ServiceAccount", cfg.Namespace, cfg.Kubeconfig, vs.namespace)
			}
			if cfg.StageTransport != config.TransportExec {
				t.Errorf("gc's executor config: stage_transport %q, want exec (gc runs no stages, and has no agent CA)", cfg.StageTransport)
			}
			for _, p := range cfg.Pools {
				var pool extv1beta1.SandboxWarmPool
				objs.Decode(t, "SandboxWarmPool", p.Name, &pool)
				if objs.Find("SandboxTemplate", pool.Spec.TemplateRef.Name) == nil {
					t.Errorf("pool %s uses template %s, which the chart does not render", p.Name, pool.Spec.TemplateRef.Name)
				}
			}
		})
	}
}

// Two releases in two namespaces share no cluster-scoped name, so both install on one cluster.
func TestClusterScopedNamesAreReleaseUnique(t *testing.T) {
	a := helmchart.Render(t, "sandbox-executor", "sandbox-executor", "coldStart: {enabled: true}\n")
	b := helmchart.Render(t, "sandbox-executor", "e2e-install", "coldStart: {enabled: true}\n")
	for _, kind := range clusterScoped {
		for _, u := range a.OfKind(kind) {
			if b.Find(kind, u.GetName()) != nil {
				t.Errorf("both releases render %s %q", kind, u.GetName())
			}
		}
	}
}

// The chart's templates pass doctor's own hardening checks (gVisor, no token, no privilege
// escalation, limits, egress restricted, the fence check), and ours containers are locked down.
func TestEverythingIsHardened(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			objs := helmchart.Render(t, vs.release, vs.namespace, vs.values)
			cfg := executorConfig(t, objs, vs.release)
			for _, u := range objs.OfKind("SandboxTemplate") {
				var tmpl extv1beta1.SandboxTemplate
				objs.Decode(t, "SandboxTemplate", u.GetName(), &tmpl)
				if fails, warns := doctor.TemplateProblems(&tmpl, cfg.RuntimeClasses, cfg.RequireFence); len(fails)+len(warns) > 0 {
					t.Errorf("template %s: %s", tmpl.Name, strings.Join(append(fails, warns...), "; "))
				}
				if tmpl.Spec.EnvVarsInjectionPolicy != extv1beta1.EnvVarsInjectionPolicyDisallowed {
					t.Errorf("template %s: claims may inject env (%q)", tmpl.Name, tmpl.Spec.EnvVarsInjectionPolicy)
				}
			}
			for _, spec := range ourPods(t, objs) {
				sc := spec.SecurityContext
				if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
					t.Errorf("pod %s: want runAsNonRoot and seccomp RuntimeDefault, got %+v", spec.name, sc)
				}
				for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
					csc := c.SecurityContext
					if csc == nil || csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation ||
						csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem ||
						csc.Capabilities == nil || !slices.Equal(csc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(csc.Capabilities.Add) > 0 {
						t.Errorf("pod %s container %s: want no privilege escalation, a read-only root and all capabilities dropped, got %+v", spec.name, c.Name, csc)
					}
					if c.Resources.Limits.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
						t.Errorf("pod %s container %s: no CPU or memory limit", spec.name, c.Name)
					}
				}
			}
		})
	}
}

// Images are pinned: by default to the chart's appVersion (make release stamps it), never latest.
func TestImagesArePinned(t *testing.T) {
	tag := regexp.MustCompile(`^[^:@]+(:[^/:@]+|@sha256:[0-9a-f]{64})$`)
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			objs := helmchart.Render(t, vs.release, vs.namespace, vs.values)
			for _, img := range allImages(t, objs) {
				if !tag.MatchString(img) || strings.HasSuffix(img, ":latest") {
					t.Errorf("image %q: want a pinned tag or digest", img)
				}
			}
		})
	}
	out, err := helmchart.Template(t, "sandbox-executor", "sandbox-executor", "images: {tag: latest}\n")
	if err == nil || !strings.Contains(err.Error(), "registry.example.com/sandbox-executor/sandbox-executor-agent:latest: pin a tag or digest") {
		t.Errorf("images.tag latest: want a one-line refusal, got %v\n%s", err, out)
	}
}

// The runner: GitLab's Secret key name, the executor's ServiceAccount, the runner's own label
// (which the NetworkPolicies select), registration retries, and the token kept out of the pod spec.
func TestRunnerDeployment(t *testing.T) {
	objs := helmchart.Render(t, "ci", "ci-sandbox", "runner: {secret: my-runner-secret, registerAttempts: 5}\n")
	var d appsv1.Deployment
	objs.Decode(t, "Deployment", "ci-sandbox-executor-runner", &d)
	pod := d.Spec.Template.Spec
	if pod.ServiceAccountName != "ci-sandbox-executor" || pod.AutomountServiceAccountToken == nil || !*pod.AutomountServiceAccountToken {
		t.Errorf("runner pod: ServiceAccount %q with its token mounted, want ci-sandbox-executor", pod.ServiceAccountName)
	}
	c := pod.Containers[0]
	const socket = "/home/nonroot/.sandbox-executor/stages.sock"
	// The runner image's entrypoint is `sandbox-executor start-runner` (tools/images): the args
	// are its flags, not the verb again, which would end flag parsing there.
	if !slices.Equal(c.Args, []string{"--register-attempts", "5", "--stage-server", socket}) {
		t.Errorf("runner args %q: want start-runner's flags, 5 registration attempts and the stage server", c.Args)
	}
	var cm corev1.ConfigMap
	objs.Decode(t, "ConfigMap", "ci-sandbox-executor-config", &cm)
	if !strings.Contains(cm.Data["config.toml"], `stage_server = "`+socket+`"`) {
		t.Errorf("the runner's executor config does not name the stage server's socket:\n%s", cm.Data["config.toml"])
	}
	if strings.Contains(cm.Data["gc.toml"], "stage_server") {
		t.Errorf("gc's config names a stage server:\n%s", cm.Data["gc.toml"])
	}
	// prepare, run and cleanup start the stage launcher, which hands them to the server; config
	// starts the executor.
	var runnerCM corev1.ConfigMap
	objs.Decode(t, "ConfigMap", "ci-sandbox-executor-runner", &runnerCM)
	template := runnerCM.Data["runner-template.toml"]
	for _, line := range []string{`prepare_exec = "/usr/local/bin/sandbox-executor-stage"`, `cleanup_exec = "/usr/local/bin/sandbox-executor-stage"`,
		`run_exec = "/usr/local/bin/sandbox-executor-stage"`, `config_exec = "/usr/local/bin/sandbox-executor"`} {
		if !strings.Contains(template, line) {
			t.Errorf("the runner's [runners.custom] lacks %s:\n%s", line, template)
		}
	}
	// runner.serveRun false: run in its own process, prepare and cleanup still served.
	direct := helmchart.Render(t, "ci", "ci-sandbox", "runner: {secret: s, registerAttempts: 5, serveRun: false}\n")
	direct.Decode(t, "ConfigMap", "ci-sandbox-executor-runner", &runnerCM)
	if template := runnerCM.Data["runner-template.toml"]; !strings.Contains(template, `run_exec = "/usr/local/bin/sandbox-executor"`) ||
		!strings.Contains(template, `prepare_exec = "/usr/local/bin/sandbox-executor-stage"`) {
		t.Errorf("runner.serveRun false: want run_exec the executor, prepare_exec the launcher:\n%s", template)
	}
	off := helmchart.Render(t, "ci", "ci-sandbox", "runner: {secret: s, registerAttempts: 5, stageServer: false}\n")
	off.Decode(t, "Deployment", "ci-sandbox-executor-runner", &d)
	off.Decode(t, "ConfigMap", "ci-sandbox-executor-config", &cm)
	if args := d.Spec.Template.Spec.Containers[0].Args; slices.Contains(args, "--stage-server") || strings.Contains(cm.Data["config.toml"], "stage_server") {
		t.Errorf("runner.stageServer false still serves stages: args %q", args)
	}
	off.Decode(t, "ConfigMap", "ci-sandbox-executor-runner", &runnerCM)
	if template := runnerCM.Data["runner-template.toml"]; strings.Contains(template, "sandbox-executor-stage") {
		t.Errorf("runner.stageServer false still starts the stage launcher:\n%s", template)
	}
	var token *corev1.EnvVar
	for i := range c.Env {
		if c.Env[i].Name == "CI_SERVER_TOKEN" {
			token = &c.Env[i]
		}
	}
	if token == nil || token.Value != "" || token.ValueFrom == nil || token.ValueFrom.SecretKeyRef == nil ||
		token.ValueFrom.SecretKeyRef.Name != "my-runner-secret" || token.ValueFrom.SecretKeyRef.Key != "runner-token" {
		t.Errorf("CI_SERVER_TOKEN: want it from Secret my-runner-secret key runner-token, got %+v", token)
	}
	if got := d.Spec.Template.Labels["app.kubernetes.io/name"]; got != "sandbox-executor-runner" {
		t.Errorf("runner pods labelled app.kubernetes.io/name=%q", got)
	}
	var tmpl extv1beta1.SandboxTemplate
	objs.Decode(t, "SandboxTemplate", "duo-gvisor", &tmpl)
	ingress := tmpl.Spec.NetworkPolicy.Ingress
	if len(ingress) != 1 || len(ingress[0].From) != 1 || ingress[0].From[0].PodSelector == nil ||
		!selects(ingress[0].From[0].PodSelector.MatchLabels, d.Spec.Template.Labels) {
		t.Errorf("template duo-gvisor's ingress does not admit the runner pods by label: %+v", ingress)
	}
}

// NetworkPolicies admit runners by label, never by address.
func TestNetworkPoliciesSelectRunnersByLabel(t *testing.T) {
	objs := helmchart.Render(t, "ci", "ci-sandbox", `
egressProxy: {enabled: true}
gitlab: {cidrs: [192.0.2.10/32]}
templates:
  - {name: duo-gvisor, image: "registry.example.com/duo/ci:bookworm"}
  - {name: duo-proxied, image: "registry.example.com/duo/ci:bookworm", egress: proxied}
`)
	var runner appsv1.Deployment
	objs.Decode(t, "Deployment", "ci-sandbox-executor-runner", &runner)
	var np networkingv1.NetworkPolicy
	objs.Decode(t, "NetworkPolicy", "ci-sandbox-executor-egress-proxy", &np)
	var admin bool
	for _, rule := range np.Spec.Ingress {
		for _, peer := range rule.From {
			if peer.IPBlock != nil {
				t.Errorf("egress proxy NetworkPolicy admits an ipBlock %s", peer.IPBlock.CIDR)
			}
			if peer.PodSelector != nil && selects(peer.PodSelector.MatchLabels, runner.Spec.Template.Labels) && rule.Ports[0].Port.IntValue() == 3129 {
				admin = true
			}
		}
	}
	if !admin {
		t.Errorf("egress proxy NetworkPolicy does not admit the runners to the admin port: %+v", np.Spec.Ingress)
	}
	var proxy appsv1.Deployment
	objs.Decode(t, "Deployment", "ci-sandbox-executor-egress-proxy", &proxy)
	var proxied extv1beta1.SandboxTemplate
	objs.Decode(t, "SandboxTemplate", "duo-proxied", &proxied)
	egressRules := proxied.Spec.NetworkPolicy.Egress
	if len(egressRules) != 2 || egressRules[1].To[0].PodSelector == nil || !selects(egressRules[1].To[0].PodSelector.MatchLabels, proxy.Spec.Template.Labels) {
		t.Errorf("proxied template: egress should be DNS and the proxy's pods, got %+v", egressRules)
	}
	if !selects(np.Spec.Ingress[0].From[0].PodSelector.MatchLabels, proxied.Spec.PodTemplate.ObjectMeta.Labels) {
		t.Errorf("the proxy does not admit the proxied template's pods")
	}
	if _, err := loadEgressConfig(t, objs, "ci-sandbox-executor-egress-proxy", nil); err != nil {
		t.Errorf("the egress proxy's config does not load: %v", err)
	}
}

// loadEgressConfig loads the proxy's rendered config as the proxy would, with its admin token
// file (a Secret in the pod) moved to a file of this test, and its admin TLS files to the files
// of files (path in the pod: file here); without them, to a certificate of this test.
func loadEgressConfig(t *testing.T, objs *helmchart.Objects, name string, files map[string]string) (*egress.Built, error) {
	t.Helper()
	var cfgMap corev1.ConfigMap
	objs.Decode(t, "ConfigMap", name, &cfgMap)
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("a-token-of-at-least-16-characters"), 0o600); err != nil {
		t.Fatal(err)
	}
	if files == nil {
		files = renderedAdminTLS(t, objs, dir)
	}
	path := filepath.Join(dir, "config.toml")
	text := strings.ReplaceAll(cfgMap.Data["config.toml"], egressAdminToken, token)
	for from, to := range files {
		text = strings.ReplaceAll(text, from, to)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return egress.LoadConfig(path)
}

// gc has its own ServiceAccount, which may list and delete claims (and with cold starts,
// Sandboxes) and nothing else.
func TestGCHasItsOwnLeastPrivilege(t *testing.T) {
	for _, tc := range []struct {
		name, values string
		// bound: drain.runningJobTimeout applies (the default): gc patches claims, deletes the
		// pods that hold a drain past it, and reads Nodes.
		cold, bound bool
	}{
		{name: "defaults", bound: true},
		{name: "cold starts", values: "coldStart: {enabled: true}\n", cold: true, bound: true},
		{name: "no drain bound", values: "drain: {runningJobTimeout: \"\"}\n"},
		{name: "drains do not wait", values: "drain: {waitForRunningJobs: false}\n"},
		{name: "cold starts and no drain bound", values: "coldStart: {enabled: true}\ndrain: {runningJobTimeout: \"\"}\n", cold: true},
		{name: "namespace only", values: "clusterScoped: {create: false}\nruntimeClass: {name: gvisor}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := []string{"delete sandboxclaims.extensions.agents.x-k8s.io", "list sandboxclaims.extensions.agents.x-k8s.io"}
			if tc.cold {
				want = append(want, "delete sandboxes.agents.x-k8s.io", "list sandboxes.agents.x-k8s.io")
			}
			wantArgs := []string{"--config", "/etc/sandbox-executor/gc.toml", "gc", "--delete"}
			if tc.bound {
				want = append(want, "patch sandboxclaims.extensions.agents.x-k8s.io", "list pods.", "delete pods.")
				if tc.cold {
					want = append(want, "patch sandboxes.agents.x-k8s.io")
				}
				wantArgs = append(wantArgs, "--drain-timeout", "1h")
			}
			objs := helmchart.Render(t, "sandbox-executor", "ci", tc.values)
			var cj batchv1.CronJob
			objs.Decode(t, "CronJob", "sandbox-executor-gc", &cj)
			pod := cj.Spec.JobTemplate.Spec.Template.Spec
			if pod.ServiceAccountName != "sandbox-executor-gc" {
				t.Errorf("gc runs as ServiceAccount %q, want its own sandbox-executor-gc", pod.ServiceAccountName)
			}
			if got := pod.Containers[0].Args; !slices.Equal(got, wantArgs) {
				t.Errorf("gc runs with %q, want %q", got, wantArgs)
			}
			var role rbacv1.Role
			objs.Decode(t, "Role", "sandbox-executor-gc", &role)
			if got, want := ruleStrings(role.Rules), sorted(want); !slices.Equal(got, want) {
				t.Errorf("gc's Role grants %q, want exactly %q", got, want)
			}
			nodes := objs.Find("ClusterRole", "ci-sandbox-executor-gc-nodes")
			if !tc.bound {
				if nodes != nil || objs.Find("ClusterRoleBinding", "ci-sandbox-executor-gc-nodes") != nil {
					t.Error("without the drain bound gc still may read Nodes")
				}
				return
			}
			var cr rbacv1.ClusterRole
			objs.Decode(t, "ClusterRole", "ci-sandbox-executor-gc-nodes", &cr)
			if got := ruleStrings(cr.Rules); !slices.Equal(got, []string{"get nodes."}) {
				t.Errorf("gc's ClusterRole grants %q, want exactly get nodes", got)
			}
			var crb rbacv1.ClusterRoleBinding
			objs.Decode(t, "ClusterRoleBinding", "ci-sandbox-executor-gc-nodes", &crb)
			if crb.RoleRef.Name != cr.Name || len(crb.Subjects) != 1 || crb.Subjects[0].Name != "sandbox-executor-gc" || crb.Subjects[0].Namespace != "ci" {
				t.Errorf("gc-nodes binding %+v: want the ClusterRole bound to ServiceAccount ci/sandbox-executor-gc only", crb)
			}
			// gc's patches are held to annotations by the release's policy, as the executor's are.
			var vap admissionv1.ValidatingAdmissionPolicy
			objs.Decode(t, "ValidatingAdmissionPolicy", "ci-sandbox-executor-annotations-only", &vap)
			if got := vap.Spec.MatchConditions[0].Expression; !strings.Contains(got, "'system:serviceaccount:ci:sandbox-executor-gc'") {
				t.Errorf("annotations-only policy matches %s, want gc's ServiceAccount among its users", got)
			}
		})
	}
}

// ruleStrings lists "verb resource.group" for each grant of rules, sorted.
func ruleStrings(rules []rbacv1.PolicyRule) []string {
	var got []string
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					got = append(got, v+" "+res+"."+g)
				}
			}
		}
	}
	return sorted(got)
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// The cold-start admission policy holds this release's ServiceAccount, in this release's
// namespace, to this release's RuntimeClass; without coldStart it is not there at all.
func TestColdStartPolicyMatchesTheRelease(t *testing.T) {
	objs := helmchart.Render(t, "duo", "duo-ci", "coldStart: {enabled: true}\nexecutor: {unknownImage: cold}\n")
	name := "duo-ci-duo-sandbox-executor-cold-images"
	var vap admissionv1.ValidatingAdmissionPolicy
	objs.Decode(t, "ValidatingAdmissionPolicy", name, &vap)
	if got := vap.Spec.MatchConditions[0].Expression; got != "request.userInfo.username == 'system:serviceaccount:duo-ci:duo-sandbox-executor'" {
		t.Errorf("policy matches %s, want this release's ServiceAccount", got)
	}
	var rc unstructured.Unstructured = *objs.Find("RuntimeClass", "duo-ci-duo-sandbox-executor-gvisor")
	if !strings.Contains(vap.Spec.Validations[0].Expression, "'"+rc.GetName()+"'") {
		t.Errorf("policy holds sandboxes to %s, want RuntimeClass %s", vap.Spec.Validations[0].Expression, rc.GetName())
	}
	var binding admissionv1.ValidatingAdmissionPolicyBinding
	objs.Decode(t, "ValidatingAdmissionPolicyBinding", name, &binding)
	if binding.Spec.PolicyName != name || !slices.Equal(binding.Spec.ValidationActions, []admissionv1.ValidationAction{admissionv1.Deny}) ||
		binding.Spec.MatchResources.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "duo-ci" {
		t.Errorf("binding %+v: want Deny on policy %s in namespace duo-ci", binding.Spec, name)
	}
	off := helmchart.Render(t, "duo", "duo-ci", "")
	if off.Find("ValidatingAdmissionPolicy", name) != nil || off.Find("ValidatingAdmissionPolicyBinding", name) != nil || off.Find("Role", "duo-sandbox-executor-cold-images") != nil {
		t.Error("without coldStart the chart still renders the cold-start policy or Role")
	}
}

// helm install needs the namespace before it renders anything (it stores the release there), so
// by default the chart renders none; with namespace.create it renders one with Pod Security labels.
func TestNamespaceOnlyWhenAsked(t *testing.T) {
	if ns := helmchart.Render(t, "ci", "ci-sandbox", "").OfKind("Namespace"); len(ns) > 0 {
		t.Errorf("the default render has a Namespace, which helm install cannot create: %v", ns[0].GetName())
	}
	var ns corev1.Namespace
	helmchart.Render(t, "ci", "ci-sandbox", "namespace: {create: true}\n").Decode(t, "Namespace", "ci-sandbox", &ns)
	// privileged: the netstack fence's init container holds NET_ADMIN inside the sandbox.
	if ns.Labels["pod-security.kubernetes.io/enforce"] != "privileged" || ns.Labels["pod-security.kubernetes.io/warn"] != "baseline" {
		t.Errorf("namespace labels %v: want Pod Security enforce privileged, warn baseline", ns.Labels)
	}
}

// Values that cannot work are refused with one line that says what to change.
func TestBadValuesAreRefused(t *testing.T) {
	for _, tc := range []struct{ values, want string }{
		{"executor: {unknownImage: cold}\n", "executor.unknownImage cold needs coldStart.enabled"},
		{"runtimeClass: {create: false}\n", "runtimeClass.name is required when runtimeClass.create or clusterScoped.create is false"},
		{"templates: [{name: t, image: x:1, egress: open}]\n", `at '/templates/0/egress': value must be one of 'direct', 'proxied', 'none'`},
		{"templates: [{name: duo-gvisor, egress: proxied}]\n", "templates[duo-gvisor].image is required"},
		{"runner: {secret: \"\"}\n", "runner.secret: name the Secret holding key runner-token"},
	} {
		_, err := helmchart.Template(t, "sandbox-executor", "sandbox-executor", tc.values)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("values %q: want an error with %q, got %v", tc.values, tc.want, err)
		}
	}
}

// The local cluster's values keep the names the e2e and security suites use.
func TestLocalValuesKeepTheSuitesNames(t *testing.T) {
	objs := helmchart.Render(t, "sandbox-executor", "sandbox-executor", localValues())
	for _, want := range []struct{ kind, name string }{
		{"SandboxWarmPool", "duo-default"}, {"SandboxWarmPool", "duo-proxied"}, {"SandboxWarmPool", "duo-posix"},
		{"SandboxWarmPool", "duo-flow"}, {"SandboxWarmPool", "duo-flow-hardened"},
		{"SandboxTemplate", "duo-gvisor"}, {"SandboxTemplate", "duo-gvisor-proxied"}, {"SandboxTemplate", "posix-gvisor"},
		{"Namespace", "sandbox-executor"}, {"ServiceAccount", "sandbox-executor"}, {"Role", "sandbox-executor"}, {"Role", "sandbox-executor-cold-images"},
		{"ClusterRole", "sandbox-executor-doctor"}, {"ValidatingAdmissionPolicy", "sandbox-executor-cold-images"},
	} {
		if objs.Find(want.kind, want.name) == nil {
			t.Errorf("the local values render no %s %s", want.kind, want.name)
		}
	}
	if objs.Find("RuntimeClass", "gvisor") != nil || objs.Find("Deployment", "sandbox-executor-runner") != nil {
		t.Error("the local cluster applies RuntimeClass gvisor itself and runs the runner on the host")
	}
}

// executorConfig loads gc's config (gc.toml) and checks that the runner's (config.toml) is the
// same plus the runner image's binaries, which exist only in that image.
func executorConfig(t *testing.T, objs *helmchart.Objects, release string) *config.Config {
	t.Helper()
	var cm corev1.ConfigMap
	objs.Decode(t, "ConfigMap", fullname(release)+"-config", &cm)
	cfg, err := config.Parse("gc.toml", []byte(cm.Data["gc.toml"]))
	if err != nil {
		t.Fatalf("the executor config the chart renders does not load: %v\n%s", err, cm.Data["gc.toml"])
	}
	var extra []string
	for _, l := range strings.Split(cm.Data["config.toml"], "\n") {
		if !strings.HasPrefix(l, "#") && !strings.Contains(cm.Data["gc.toml"], l) {
			extra = append(extra, l)
		}
	}
	var want []string
	if strings.Contains(cm.Data["config.toml"], "egress_admin_token_file") {
		want = append(want, `egress_admin_token_file = "/etc/sandbox-executor/egress-admin/token"`, `egress_admin_ca_file = "/etc/sandbox-executor/egress-admin/ca.crt"`)
	}
	want = append(want, `agent_binary = "/usr/local/bin/sandbox-executor-agent"`, `helper_binary = "/usr/bin/gitlab-runner-helper"`)
	if strings.Contains(cm.Data["config.toml"], "stage_server") {
		want = append(want, `stage_server = "/home/nonroot/.sandbox-executor/stages.sock"`)
	}
	if strings.Contains(cm.Data["config.toml"], "agent_ca_key") {
		want = append(want, `agent_ca_cert = "/etc/sandbox-executor-agent-ca/tls.crt"`, `agent_ca_key = "/etc/sandbox-executor-agent-ca/tls.key"`, `stage_transport = "network"`)
	}
	if !slices.Equal(extra, want) {
		t.Errorf("config.toml differs from gc.toml by %q, want only %q", extra, want)
	}
	return cfg
}

type podSpec struct {
	name string
	corev1.PodSpec
}

// ourPods are the pods running the project's own images (not job pods): Deployments, CronJobs
// and the agent CA's hook Job.
func ourPods(t *testing.T, objs *helmchart.Objects) []podSpec {
	var out []podSpec
	for _, u := range objs.OfKind("Deployment") {
		var d appsv1.Deployment
		objs.Decode(t, "Deployment", u.GetName(), &d)
		out = append(out, podSpec{d.Name, d.Spec.Template.Spec})
	}
	for _, u := range objs.OfKind("CronJob") {
		var cj batchv1.CronJob
		objs.Decode(t, "CronJob", u.GetName(), &cj)
		out = append(out, podSpec{cj.Name, cj.Spec.JobTemplate.Spec.Template.Spec})
	}
	for _, u := range objs.OfKind("Job") {
		var job batchv1.Job
		objs.Decode(t, "Job", u.GetName(), &job)
		out = append(out, podSpec{job.Name, job.Spec.Template.Spec})
	}
	return out
}

func allImages(t *testing.T, objs *helmchart.Objects) []string {
	var out []string
	add := func(spec corev1.PodSpec) {
		for _, c := range slices.Concat(spec.InitContainers, spec.Containers) {
			out = append(out, c.Image)
		}
	}
	for _, p := range ourPods(t, objs) {
		add(p.PodSpec)
	}
	for _, u := range objs.OfKind("SandboxTemplate") {
		var tmpl extv1beta1.SandboxTemplate
		objs.Decode(t, "SandboxTemplate", u.GetName(), &tmpl)
		add(tmpl.Spec.PodTemplate.Spec)
	}
	return out
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func fullname(release string) string {
	if strings.Contains(release, "sandbox-executor") {
		return release
	}
	return release + "-sandbox-executor"
}

// gitlabFlowImageTag is the tag of GitLab's flow images that GitLab's flows name today, which
// values-duo-flow.yaml pins for both (docs/agent-config.md#following-gitlabs-next-flow-image-tag).
const gitlabFlowImageTag = "v0.0.21"

// values-duo-flow.yaml serves GitLab's default flow image and its hardened variant: each pool
// lists the image its template runs, and serves the jobs naming another tag of it (GitLab's
// default moving on) with a warning; both pin the tag GitLab's flows name today, the same for
// both images; each grants its jobs their own instance on the egress proxy and no npm registry
// (both images ship the duo CLI), and the hardened image runs as its own UID with builds and
// cache it can write.
func TestDuoFlowValues(t *testing.T) {
	const release = "duo"
	objs := helmchart.Render(t, release, "duo-flows", chartFile("values-duo-flow.yaml"))
	cfg := executorConfig(t, objs, release)
	for _, want := range []struct {
		pool, template, repository string
	}{
		{"duo-flow", "duo-gvisor-flow", "registry.gitlab.com/gitlab-org/duo-workflow/default-docker-image/workflow-generic-image"},
		{"duo-flow-hardened", "duo-gvisor-flow-hardened", "registry.gitlab.com/gitlab-org/duo-workflow/default-docker-image/workflow-generic-image-hardened"},
	} {
		var template extv1beta1.SandboxTemplate
		objs.Decode(t, "SandboxTemplate", want.template, &template)
		runs := template.Spec.PodTemplate.Spec.Containers[0].Image
		if runs != want.repository+":"+gitlabFlowImageTag {
			t.Errorf("template %s runs %s, want %s:%s", want.template, runs, want.repository, gitlabFlowImageTag)
		}
		for image, otherTag := range map[string]bool{runs: false, want.repository + ":v0.0.99": true} {
			placement, err := cfg.Place(image)
			if err != nil || placement != (config.Placement{Pool: want.pool, OtherTag: otherTag}) {
				t.Errorf("image %s goes to %+v, %v; want pool %s, another tag than its template's %s: %t", image, placement, err, want.pool, runs, otherTag)
			}
		}
		p := cfg.Pool(want.pool)
		if p.EgressProxy == "" || !p.EgressInstance || !p.EgressInstanceWildcard || len(p.EgressAllow) != 0 {
			t.Errorf("pool %s: egress_proxy %q, egress_instance %t, wildcard %t, egress_allow %v", want.pool, p.EgressProxy, p.EgressInstance, p.EgressInstanceWildcard, p.EgressAllow)
		}
	}
	var hardened extv1beta1.SandboxTemplate
	objs.Decode(t, "SandboxTemplate", "duo-gvisor-flow-hardened", &hardened)
	spec := hardened.Spec.PodTemplate.Spec
	sc := spec.SecurityContext
	if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 1001 || sc.FSGroup == nil || *sc.FSGroup != 1001 || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("the hardened image's pod security context: %+v; want UID 1001, fsGroup 1001, non-root", sc)
	}
	var mounts []string
	for _, m := range spec.Containers[0].VolumeMounts {
		mounts = append(mounts, m.MountPath)
	}
	if !slices.Contains(mounts, "/builds") || !slices.Contains(mounts, "/cache") {
		t.Errorf("the hardened image's mounts %v lack /builds or /cache", mounts)
	}
}

// A pool's images render as exact references, with serve_other_tags only where the pool sets
// serveOtherTags; a pattern, or serveOtherTags without an image, is refused at install in one line.
func TestPoolsServeExactImages(t *testing.T) {
	const release = "ci"
	objs := helmchart.Render(t, release, "ci-sandbox", `
templates:
  - {name: duo-gvisor, image: "registry.corp.example/ci:1", egress: proxied}
pools:
  - {name: exact, template: duo-gvisor, images: ["registry.corp.example/ci:1"]}
  - {name: tags, template: duo-gvisor, images: ["registry.corp.example/flow:v1"], serveOtherTags: true}
executor: {defaultPool: exact}
`)
	cfg := executorConfig(t, objs, release)
	if p := cfg.Pool("exact"); p == nil || p.ServeOtherTags || !slices.Equal(p.Images, []string{"registry.corp.example/ci:1"}) {
		t.Errorf("pool exact: %+v; want its one image, no other tags", p)
	}
	if p := cfg.Pool("tags"); p == nil || !p.ServeOtherTags {
		t.Errorf("pool tags: %+v; want serve_other_tags", p)
	}
	for image, want := range map[string]config.Placement{
		"registry.corp.example/ci:1":    {Pool: "exact"},
		"registry.corp.example/flow:v2": {Pool: "tags", OtherTag: true},
	} {
		if got, err := cfg.Place(image); err != nil || got != want {
			t.Errorf("Place(%s) = %+v, %v; want %+v", image, got, err, want)
		}
	}
	if _, err := cfg.Place("registry.corp.example/ci:2"); err == nil {
		t.Error("another tag of a pool without serveOtherTags was placed")
	}
	for _, tc := range []struct{ values, want string }{
		{"pools: [{name: duo-default, template: duo-gvisor, images: ['registry.example.com/duo/ci:*']}]\n",
			`pools[duo-default].images "registry.example.com/duo/ci:*" is a pattern: list the exact image its template runs, and set serveOtherTags: true`},
		{"pools: [{name: duo-default, template: duo-gvisor, images: [], serveOtherTags: true}]\n", "pools[duo-default].serveOtherTags needs images"},
		{"pools: [{name: duo-default, template: duo-gvisor, serveOtherTags: 'yes'}]\n", "/pools/0/serveOtherTags"},
	} {
		refused(t, tc.values, tc.want)
	}
}

// With agentTLS, job pods trust the agent CA's certificate from its ConfigMap, the runner pods
// alone mount its key from the Secret, and the runner's stages go over the network; without
// it, over exec, and job pods get no CA.
func TestAgentTLS(t *testing.T) {
	for _, enabled := range []bool{true, false} {
		const release = "sandbox-executor"
		objs := helmchart.Render(t, release, "ci-sandbox", fmt.Sprintf("agentTLS: {enabled: %t, name: my-agent-ca}\n", enabled))
		var cm corev1.ConfigMap
		objs.Decode(t, "ConfigMap", fullname(release)+"-config", &cm)
		runnerConfig := cm.Data["config.toml"]
		if got := strings.Contains(runnerConfig, `stage_transport = "network"`) && strings.Contains(runnerConfig, `agent_ca_key = "/etc/sandbox-executor-agent-ca/tls.key"`); got != enabled {
			t.Errorf("agentTLS %t: the runner's config says network with the agent CA: %t\n%s", enabled, got, runnerConfig)
		}
		var tmpl extv1beta1.SandboxTemplate
		objs.Decode(t, "SandboxTemplate", "duo-gvisor", &tmpl)
		var trusted bool
		for _, e := range tmpl.Spec.PodTemplate.Spec.Containers[0].Env {
			if e.Name == "SANDBOX_EXECUTOR_AGENT_CLIENT_CA" {
				trusted = e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil && e.ValueFrom.ConfigMapKeyRef.Name == "my-agent-ca" && e.Value == ""
			}
		}
		if trusted != enabled {
			t.Errorf("agentTLS %t: job pods trust the CA from ConfigMap my-agent-ca: %t", enabled, trusted)
		}
		for _, pod := range ourPods(t, objs) {
			mounted := false
			for _, v := range pod.Volumes {
				if v.Secret != nil && v.Secret.SecretName == "my-agent-ca" {
					mounted = true
				}
			}
			if want := enabled && strings.HasSuffix(pod.name, "-runner"); mounted != want {
				t.Errorf("agentTLS %t: pod %s mounts the agent CA's key: %t, want %t", enabled, pod.name, mounted, want)
			}
		}
	}
}

// The executor may patch its claims and Sandboxes (the job's outcome), and gc its claims (a job
// that holds a drain), and the chart holds those patches to annotations, for this release's
// ServiceAccounts in this release's namespace.
func TestPatchesHeldToAnnotations(t *testing.T) {
	objs := helmchart.Render(t, "duo", "duo-ci", "")
	name := "duo-ci-duo-sandbox-executor-annotations-only"
	var vap admissionv1.ValidatingAdmissionPolicy
	objs.Decode(t, "ValidatingAdmissionPolicy", name, &vap)
	if got := vap.Spec.MatchConditions[0].Expression; got != "request.userInfo.username in ['system:serviceaccount:duo-ci:duo-sandbox-executor', 'system:serviceaccount:duo-ci:duo-sandbox-executor-gc']" {
		t.Errorf("policy matches %s, want this release's ServiceAccounts, the executor's and gc's", got)
	}
	if len(vap.Spec.Validations) == 0 || vap.Spec.Validations[0].Expression != "object.spec == oldObject.spec" {
		t.Errorf("policy validations %+v: want the spec unchanged first", vap.Spec.Validations)
	}
	var binding admissionv1.ValidatingAdmissionPolicyBinding
	objs.Decode(t, "ValidatingAdmissionPolicyBinding", name, &binding)
	if binding.Spec.PolicyName != name || binding.Spec.MatchResources.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "duo-ci" {
		t.Errorf("binding %+v: want policy %s in namespace duo-ci", binding.Spec, name)
	}
}

// The exporter and gc run the executor's image, which holds neither the agent nor the runner's
// helper binary: they read gc.toml, not config.toml, which names those binaries and does not
// load without them (the exporter read config.toml and crash-looped; found by the soak).
func TestOnlyRunnerPodsReadTheRunnersConfig(t *testing.T) {
	objs := helmchart.Render(t, "sandbox-executor", "ci", "exporter: {enabled: true}\n")
	checked := 0
	for _, p := range ourPods(t, objs) {
		for _, c := range p.Containers {
			i := slices.Index(c.Args, "--config")
			if i < 0 || i+1 >= len(c.Args) {
				continue
			}
			checked++
			runnerImage := strings.Contains(c.Image, "/sandbox-executor-runner:")
			if readsRunners := c.Args[i+1] == "/etc/sandbox-executor/config.toml"; readsRunners != runnerImage {
				t.Errorf("%s/%s (image %s) reads %s", p.name, c.Name, c.Image, c.Args[i+1])
			}
		}
	}
	if checked < 2 {
		t.Errorf("%d containers with --config, want at least gc and the exporter", checked)
	}
}
