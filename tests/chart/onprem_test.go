package chart_test

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/egress/allowlist"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/helmchart"
)

// An install with only the instance's URL, the token's Secret and the job image is fenced and
// fast: agent TLS over the network with a CA the chart makes, the stage server, and job pods
// that reach only the egress proxy, which grants each job its own instance.
func TestDefaultsAreTheSecureFastPath(t *testing.T) {
	const release = "ci"
	objs := helmchart.Render(t, release, "ci-sandbox", `
gitlab: {url: "https://gitlab.corp.example"}
runner: {secret: my-token}
templates: [{name: duo-gvisor, image: "registry.corp.example/ci:1", egress: proxied}]
pools: [{name: duo-default, template: duo-gvisor, replicas: 2, images: ["registry.corp.example/ci:1"], egressInstance: true}]
`)
	cfg := executorConfig(t, objs, release)
	var cm corev1.ConfigMap
	objs.Decode(t, "ConfigMap", fullname(release)+"-config", &cm)
	for _, line := range []string{`stage_transport = "network"`, `stage_server = "/home/nonroot/.sandbox-executor/stages.sock"`} {
		if !strings.Contains(cm.Data["config.toml"], line) {
			t.Errorf("the runner's config lacks %s:\n%s", line, cm.Data["config.toml"])
		}
	}
	if p := cfg.Pool("duo-default"); p == nil || p.EgressProxy == "" || !p.EgressInstance {
		t.Errorf("the default pool does not grant its jobs their instance on the proxy: %+v", p)
	}
	var job batchv1.Job
	objs.Decode(t, "Job", "ci-sandbox-executor-agent-ca", &job)
	if hook := job.Annotations["helm.sh/hook"]; hook != "pre-install,pre-upgrade" {
		t.Errorf("the agent CA Job runs at %q, want before install and every upgrade", hook)
	}
	if args := job.Spec.Template.Spec.Containers[0].Args; !slices.Equal(args, []string{"tls", "init", "--secret", "sandbox-executor-agent-ca", "--namespace", "ci-sandbox"}) {
		t.Errorf("the agent CA Job runs %q", args)
	}
	for _, v := range job.Spec.Template.Spec.Volumes {
		t.Errorf("the agent CA Job mounts %s: it needs its token only", v.Name)
	}
	var role rbacv1.Role
	objs.Decode(t, "Role", "ci-sandbox-executor-agent-ca", &role)
	for _, rule := range role.Rules {
		if slices.Contains(rule.Verbs, "get") && !slices.Equal(rule.ResourceNames, []string{"sandbox-executor-agent-ca"}) {
			t.Errorf("the agent CA Job may read %v, want the CA's objects only", rule.ResourceNames)
		}
	}
	if got := helmchart.Grants(objs.Find("Role", "ci-sandbox-executor-agent-ca")); !slices.Equal(got, []string{"create configmaps", "create secrets", "get configmaps", "get secrets"}) {
		t.Errorf("the agent CA Job's Role grants %q", got)
	}
	var tmpl extv1beta1.SandboxTemplate
	objs.Decode(t, "SandboxTemplate", "duo-gvisor", &tmpl)
	var allow string
	for _, e := range tmpl.Spec.PodTemplate.Spec.Containers[0].Env {
		if e.Name == "SANDBOX_EXECUTOR_FENCE_ALLOW" {
			allow = e.Value
		}
	}
	if allow != "ci-sandbox-executor-egress-proxy.ci-sandbox.svc:3128" {
		t.Errorf("the proxied pods' fence check must reach the proxy, not %q", allow)
	}
	// The agent CA's key reaches the runner pods only; the hook Job writes it, no pod of a job.
	for _, u := range objs.OfKind("SandboxTemplate") {
		var st extv1beta1.SandboxTemplate
		objs.Decode(t, "SandboxTemplate", u.GetName(), &st)
		for _, v := range st.Spec.PodTemplate.Spec.Volumes {
			if v.Secret != nil || v.Projected != nil {
				t.Errorf("template %s mounts a Secret or projected volume %s", st.Name, v.Name)
			}
		}
	}
}

// The instance on a private address: gitlab.cidrs and gitlab.ports feed the direct pods'
// NetworkPolicy and fence check, the egress proxy's NetworkPolicy (which otherwise admits public
// addresses only) and its allowlist.
func TestPrivateInstanceFeedsEveryFence(t *testing.T) {
	objs := helmchart.Render(t, "ci", "ci-sandbox", `
gitlab: {url: "https://gitlab.corp.internal", cidrs: [10.20.0.5/32], ports: [443, 22]}
templates:
  - {name: duo-gvisor, image: "registry.corp.example/ci:1", egress: direct}
  - {name: duo-proxied, image: "registry.corp.example/ci:1", egress: proxied}
pools:
  - {name: duo-default, template: duo-gvisor, images: ["registry.corp.example/ci:1"]}
  - {name: duo-proxied, template: duo-proxied, images: ["registry.corp.example/ci:1"]}
`)
	var direct extv1beta1.SandboxTemplate
	objs.Decode(t, "SandboxTemplate", "duo-gvisor", &direct)
	if env := envOf(direct.Spec.PodTemplate.Spec.Containers[0]); env["SANDBOX_EXECUTOR_FENCE_ALLOW"] != "10.20.0.5:443" {
		t.Errorf("the direct pods' fence allows %q, want the instance 10.20.0.5:443", env["SANDBOX_EXECUTOR_FENCE_ALLOW"])
	}
	if !egressTo(direct.Spec.NetworkPolicy.Egress, "10.20.0.5/32", 443) {
		t.Errorf("the direct pods' NetworkPolicy does not open 10.20.0.5/32:443: %+v", direct.Spec.NetworkPolicy.Egress)
	}
	var np networkingv1.NetworkPolicy
	objs.Decode(t, "NetworkPolicy", "ci-sandbox-executor-egress-proxy", &np)
	if !egressTo(np.Spec.Egress, "10.20.0.5/32", 443) || !egressTo(np.Spec.Egress, "10.20.0.5/32", 22) {
		t.Errorf("the proxy's NetworkPolicy does not open the private instance: %+v", np.Spec.Egress)
	}
	built, err := loadEgressConfig(t, objs, "ci-sandbox-executor-egress-proxy", nil)
	if err != nil {
		t.Fatal(err)
	}
	if rules := built.Allowlist.Rules(); !slices.Contains(rules, "gitlab.corp.internal:443") || !slices.Contains(rules, "gitlab.corp.internal:22") {
		t.Errorf("the proxy's allowlist %q lacks the instance", rules)
	}
	// As the instance: its name may resolve to its private address (artifact uploads go there).
	if rule, ok := built.Allowlist.Match(allowlist.Dest{Host: "gitlab.corp.internal", Port: 443}); !ok || !rule.Private {
		t.Errorf("the proxy's rule for the instance is %+v (%v), want one whose name may resolve to a private address", rule, ok)
	}
	// The default install's proxy starts: its allowlist has the instance (an empty one is refused).
	if _, err := loadEgressConfig(t, helmchart.Render(t, "ci", "ci-sandbox", ""), "ci-sandbox-executor-egress-proxy", nil); err != nil {
		t.Errorf("the default egress proxy config does not load: %v", err)
	}
	v6 := helmchart.Render(t, "ci", "ci-sandbox", "gitlab: {cidrs: ['2001:db8::5/128']}\ntemplates: [{name: duo-gvisor, image: 'r.example/ci:1', egress: direct}]\n")
	v6.Decode(t, "SandboxTemplate", "duo-gvisor", &direct)
	if got := envOf(direct.Spec.PodTemplate.Spec.Containers[0])["SANDBOX_EXECUTOR_FENCE_ALLOW"]; got != "[2001:db8::5]:443" {
		t.Errorf("an IPv6 instance's fence address is %q, want [2001:db8::5]:443", got)
	}
}

// An internal CA for the instance: the runner mounts it and names it CI_SERVER_TLS_CA_FILE,
// which gitlab-runner register turns into the runner's tls-ca-file (the API and every job's
// clone trust it); an upstream proxy reaches the runner and the egress proxy by extraEnv.
func TestInternalCAAndUpstreamProxy(t *testing.T) {
	objs := helmchart.Render(t, "ci", "ci-sandbox", `
gitlab: {certsSecretName: corp-ca}
runner: {extraEnv: [{name: HTTPS_PROXY, value: "http://proxy.corp:3128"}]}
egressProxy: {extraEnv: [{name: HTTPS_PROXY, value: "http://proxy.corp:3128"}]}
`)
	var runner appsv1.Deployment
	objs.Decode(t, "Deployment", "ci-sandbox-executor-runner", &runner)
	c := runner.Spec.Template.Spec.Containers[0]
	env := envOf(c)
	if env["CI_SERVER_TLS_CA_FILE"] != "/etc/gitlab-runner-certs/ca.crt" || env["HTTPS_PROXY"] != "http://proxy.corp:3128" {
		t.Errorf("runner env %v: want CI_SERVER_TLS_CA_FILE and the upstream proxy", env)
	}
	var mounted bool
	for _, v := range runner.Spec.Template.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == "corp-ca" {
			mounted = slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
				return m.Name == v.Name && m.MountPath == "/etc/gitlab-runner-certs"
			}) && len(v.Secret.Items) == 1 && v.Secret.Items[0].Key == "ca.crt" && v.Secret.Items[0].Path == "ca.crt"
		}
	}
	if !mounted {
		t.Errorf("the runner does not mount Secret corp-ca's ca.crt at /etc/gitlab-runner-certs/ca.crt")
	}
	var proxy appsv1.Deployment
	objs.Decode(t, "Deployment", "ci-sandbox-executor-egress-proxy", &proxy)
	if envOf(proxy.Spec.Template.Spec.Containers[0])["HTTPS_PROXY"] != "http://proxy.corp:3128" {
		t.Errorf("the egress proxy lacks its extraEnv")
	}
}

// Job pods land on a tainted gVisor node pool through the RuntimeClass's scheduling, every pod
// of ours takes nodeSelector, tolerations, affinity and priorityClassName, the runner gets a
// PodDisruptionBudget, the executor's ServiceAccount its annotations, and DNS its selector.
func TestSchedulingAndClusterSpecifics(t *testing.T) {
	sched := "{nodeSelector: {pool: system}, tolerations: [{key: dedicated, operator: Exists}], affinity: {nodeAffinity: {}}, priorityClassName: ci-critical}"
	objs := helmchart.Render(t, "ci", "ci-sandbox", `
runtimeClass: {scheduling: {nodeSelector: {sandbox.gke.io/runtime: gvisor}, tolerations: [{key: sandbox.gke.io/runtime, operator: Equal, value: gvisor, effect: NoSchedule}]}}
runner: {podDisruptionBudget: {enabled: true}, `+strings.TrimSuffix(strings.TrimPrefix(sched, "{"), "}")+`}
egressProxy: `+sched+`
gc: `+sched+`
exporter: {enabled: true, `+strings.TrimSuffix(strings.TrimPrefix(sched, "{"), "}")+`}
metricsAdapter: {enabled: true, `+strings.TrimSuffix(strings.TrimPrefix(sched, "{"), "}")+`}
agentTLS: `+sched+`
serviceAccount: {annotations: {iam.gke.io/gcp-service-account: ci@corp.iam.gserviceaccount.com}}
dns: {namespace: dns-system, podLabels: {app: coredns}}
`)
	var rc nodev1.RuntimeClass
	objs.Decode(t, "RuntimeClass", "ci-sandbox-ci-sandbox-executor-gvisor", &rc)
	if rc.Scheduling == nil || rc.Scheduling.NodeSelector["sandbox.gke.io/runtime"] != "gvisor" || len(rc.Scheduling.Tolerations) != 1 {
		t.Errorf("RuntimeClass scheduling %+v: want the gVisor pool's selector and toleration", rc.Scheduling)
	}
	pods := ourPods(t, objs)
	if len(pods) != 6 {
		t.Errorf("%d pods of ours, want runner, proxy, gc, exporter, metrics adapter and the CA Job", len(pods))
	}
	for _, p := range pods {
		if p.NodeSelector["pool"] != "system" || len(p.Tolerations) != 1 || p.Affinity == nil || p.PriorityClassName != "ci-critical" {
			t.Errorf("pod %s: scheduling %v %v %v %q", p.name, p.NodeSelector, p.Tolerations, p.Affinity, p.PriorityClassName)
		}
	}
	var pdb policyv1.PodDisruptionBudget
	objs.Decode(t, "PodDisruptionBudget", "ci-sandbox-executor-runner", &pdb)
	var runner appsv1.Deployment
	objs.Decode(t, "Deployment", "ci-sandbox-executor-runner", &runner)
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || !selects(pdb.Spec.Selector.MatchLabels, runner.Spec.Template.Labels) {
		t.Errorf("runner PodDisruptionBudget %+v", pdb.Spec)
	}
	var sa corev1.ServiceAccount
	objs.Decode(t, "ServiceAccount", "ci-sandbox-executor", &sa)
	if sa.Annotations["iam.gke.io/gcp-service-account"] == "" {
		t.Errorf("the executor's ServiceAccount lacks its annotations: %v", sa.Annotations)
	}
	var np networkingv1.NetworkPolicy
	objs.Decode(t, "NetworkPolicy", "ci-sandbox-executor-egress-proxy", &np)
	var tmpl extv1beta1.SandboxTemplate
	objs.Decode(t, "SandboxTemplate", "duo-gvisor", &tmpl)
	for name, rules := range map[string][]networkingv1.NetworkPolicyEgressRule{"proxy": np.Spec.Egress, "job pods": tmpl.Spec.NetworkPolicy.Egress} {
		dns := rules[0].To[0]
		if dns.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "dns-system" || dns.PodSelector.MatchLabels["app"] != "coredns" || len(dns.PodSelector.MatchLabels) != 1 {
			t.Errorf("%s: DNS rule %+v, want dns-system pods app=coredns", name, dns)
		}
	}
	if objs.Find("PodDisruptionBudget", "ci-sandbox-executor-runner") == nil || helmchart.Render(t, "ci", "ci-sandbox", "").Find("PodDisruptionBudget", "ci-sandbox-executor-runner") != nil {
		t.Error("the runner's PodDisruptionBudget is not opt-in")
	}
}

// A namespace-only install renders nothing cluster-scoped, names the cluster's RuntimeClass,
// and refuses what is safe only with cluster-scoped objects.
func TestNamespaceOnlyInstall(t *testing.T) {
	objs := helmchart.Render(t, "ci", "ci-sandbox", "clusterScoped: {create: false}\nruntimeClass: {name: gvisor}\n")
	for _, kind := range clusterScoped {
		for _, u := range objs.OfKind(kind) {
			t.Errorf("clusterScoped.create false renders %s %s", kind, u.GetName())
		}
	}
	var tmpl extv1beta1.SandboxTemplate
	objs.Decode(t, "SandboxTemplate", "duo-gvisor", &tmpl)
	if rc := tmpl.Spec.PodTemplate.Spec.RuntimeClassName; rc == nil || *rc != "gvisor" {
		t.Errorf("job pods run RuntimeClass %v, want the cluster's gvisor", rc)
	}
	for _, tc := range []struct{ values, want string }{
		{"clusterScoped: {create: false}\n", "runtimeClass.name is required when runtimeClass.create or clusterScoped.create is false"},
		{"clusterScoped: {create: false}\nruntimeClass: {name: gvisor}\ncoldStart: {enabled: true}\n", "coldStart.enabled needs clusterScoped.create"},
		{"clusterScoped: {create: false}\nruntimeClass: {name: gvisor}\nmetricsAdapter: {enabled: true}\n", "metricsAdapter.enabled needs clusterScoped.create"},
	} {
		refused(t, tc.values, tc.want)
	}
}

// The egress proxy's admin API (issue 26.6, the contract with the proxy and the executor): a
// token from Secret <fullname>-egress-admin key token (or the user's), mounted at
// /etc/sandbox-executor/egress-admin/token in the runner and proxy pods; the proxy admits
// tokenless requests from loopback only, and its NetworkPolicy admits the admin port from this
// release's runners only.
func TestEgressAdminToken(t *testing.T) {
	for _, tc := range []struct{ values, secret string }{
		{"", "ci-sandbox-executor-egress-admin"},
		{"egressProxy: {adminToken: {existingSecret: my-admin-token}}\n", "my-admin-token"},
	} {
		objs := helmchart.Render(t, "ci", "ci-sandbox", tc.values)
		made := objs.Find("Secret", "ci-sandbox-executor-egress-admin")
		if (made != nil) != (tc.values == "") {
			t.Errorf("values %q: the chart makes the token Secret: %t", tc.values, made != nil)
		}
		if made != nil {
			var s corev1.Secret
			objs.Decode(t, "Secret", made.GetName(), &s)
			if len(s.Data["token"]) < 32 {
				t.Errorf("the admin token has %d characters, want 32 or more", len(s.Data["token"]))
			}
		}
		built, err := loadEgressConfig(t, objs, "ci-sandbox-executor-egress-proxy", nil)
		if err != nil {
			t.Fatal(err)
		}
		// admin_allow is who may ask at all (the NetworkPolicy narrows it to the runner pods); every
		// source but loopback must send the token (egress.Admin.authorized).
		if built.Config.AdminTokenFile == "" || !slices.Equal(built.Config.AdminAllow, []string{"0.0.0.0/0", "::/0"}) {
			t.Errorf("proxy admin: token file %q, sources %q; want the token, from any source the NetworkPolicy admits", built.Config.AdminTokenFile, built.Config.AdminAllow)
		}
		var cm corev1.ConfigMap
		objs.Decode(t, "ConfigMap", "ci-sandbox-executor-config", &cm)
		if !strings.Contains(cm.Data["config.toml"], `egress_admin_token_file = "`+egressAdminToken+`"`) || strings.Contains(cm.Data["gc.toml"], "egress_admin") {
			t.Errorf("the runner's executor config must name the token file (gc's not):\n%s", cm.Data["config.toml"])
		}
		for _, name := range []string{"ci-sandbox-executor-runner", "ci-sandbox-executor-egress-proxy"} {
			var d appsv1.Deployment
			objs.Decode(t, "Deployment", name, &d)
			if !mountsSecretKeyAt(d.Spec.Template.Spec, tc.secret, "token", egressAdminToken) {
				t.Errorf("%s does not mount Secret %s key token at %s", name, tc.secret, egressAdminToken)
			}
		}
		var np networkingv1.NetworkPolicy
		objs.Decode(t, "NetworkPolicy", "ci-sandbox-executor-egress-proxy", &np)
		var runner appsv1.Deployment
		objs.Decode(t, "Deployment", "ci-sandbox-executor-runner", &runner)
		for _, rule := range np.Spec.Ingress {
			if rule.Ports[0].Port.IntValue() != 3129 {
				continue
			}
			if len(rule.From) != 1 || rule.From[0].PodSelector == nil || rule.From[0].NamespaceSelector != nil || !selects(rule.From[0].PodSelector.MatchLabels, runner.Spec.Template.Labels) ||
				rule.From[0].PodSelector.MatchLabels["app.kubernetes.io/instance"] != "ci" {
				t.Errorf("the admin port admits %+v, want this release's runner pods only", rule.From)
			}
		}
	}
}

// Runner pods (issue 26.8): only the metrics port, only from the peers named; nothing by default.
func TestRunnerNetworkPolicy(t *testing.T) {
	var np networkingv1.NetworkPolicy
	helmchart.Render(t, "ci", "ci-sandbox", "").Decode(t, "NetworkPolicy", "ci-sandbox-executor-runner", &np)
	if len(np.Spec.Ingress) != 0 || !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("by default the runner pods admit %+v (%v), want nothing", np.Spec.Ingress, np.Spec.PolicyTypes)
	}
	objs := helmchart.Render(t, "ci", "ci-sandbox", `
runner: {networkPolicy: {metricsFrom: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}], egress: [{to: [{ipBlock: {cidr: 10.0.0.0/8}}]}]}}
`)
	objs.Decode(t, "NetworkPolicy", "ci-sandbox-executor-runner", &np)
	var runner appsv1.Deployment
	objs.Decode(t, "Deployment", "ci-sandbox-executor-runner", &runner)
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].Ports) != 1 || np.Spec.Ingress[0].Ports[0].Port.IntValue() != 9252 ||
		np.Spec.Ingress[0].From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "monitoring" || !selects(np.Spec.PodSelector.MatchLabels, runner.Spec.Template.Labels) {
		t.Errorf("runner NetworkPolicy %+v: want port 9252 from the monitoring namespace", np.Spec)
	}
	if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) || len(np.Spec.Egress) != 1 {
		t.Errorf("runner.networkPolicy.egress does not restrict egress: %+v", np.Spec)
	}
}

// Values that cannot work are refused at install with one line naming the fix: by the schema
// (unknown keys, wrong types) and by the templates (what a schema cannot say).
func TestBadOnPremValuesAreRefused(t *testing.T) {
	for _, tc := range []struct{ values, want string }{
		{"runner: {sercet: x}\n", "additional properties 'sercet' not allowed"},
		{"gitlab: {ports: ['443']}\n", "/gitlab/ports/0"},
		{"executor: {readyTimeout: 2min}\n", "/executor/readyTimeout"},
		{"executor: {defaultPool: nope}\n", `executor.defaultPool "nope" names no pool: use one of duo-default`},
		{"pools: [{name: duo-default, template: duo-gvsior, images: ['x/ci:1']}]\n", `pools[duo-default].template "duo-gvsior": no templates[] entry has that name`},
		{"gitlab: {cidrs: [10.20.0.5]}\n", `gitlab.cidrs "10.20.0.5" is not a CIDR`},
		{"gitlab: {cidrs: [10.20.0.300/32]}\n", `gitlab.cidrs "10.20.0.300/32" is not a CIDR`},
		{"templates: [{name: duo-gvisor, image: 'r.example/ci:1', egress: direct}]\n", "templates[duo-gvisor].egress direct needs gitlab.cidrs"},
		{"egressProxy: {enabled: false}\n", "templates[duo-gvisor].egress proxied needs egressProxy.enabled"},
		{"gitlab: {cidrs: [10.20.0.0/24]}\ntemplates: [{name: duo-gvisor, image: 'r.example/ci:1', egress: direct}]\n", "set jobDefaults.fence.allow (or the template's fence.allow) to the instance's address: gitlab.cidrs 10.20.0.0/24 is a range"},
		{"coldStart: {enabled: true, template: nope}\n", `coldStart.template "nope": no templates[] entry has that name`},
	} {
		refused(t, tc.values, tc.want)
	}
	// Past the schema (helm --skip-schema-validation), the templates still refuse a bad duration.
	refusedRaw(t, "executor: {claimGrace: 15 minutes}\n", `executor.claimGrace "15 minutes" is not a Go duration`)
}

func refused(t *testing.T, values, want string) {
	t.Helper()
	out, err := helmchart.Template(t, "ci", "ci-sandbox", values)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("values %q: want an error with %q, got %v\n%.200s", values, want, err, out)
	}
}

// refusedRaw renders without the schema: the templates' own checks.
func refusedRaw(t *testing.T, values, want string) {
	t.Helper()
	out, err := helmchart.Template(t, "ci", "ci-sandbox", values, "--skip-schema-validation")
	if err == nil || !strings.Contains(err.Error(), want) || strings.Count(strings.TrimSpace(strings.SplitN(err.Error(), "Use --debug", 2)[0]), "\n") > 0 {
		t.Errorf("values %q: want one line with %q, got %v\n%.200s", values, want, err, out)
	}
}

// NOTES.txt names every value still at the chart's example, and nothing once they are set.
func TestNotesNameTheExampleValues(t *testing.T) {
	notes := helmchart.Notes(t, "ci", "ci-sandbox", "gitlab: {cidrs: [192.0.2.10/32]}\njobDefaults: {fence: {allow: ['192.0.2.10:443']}}\n")
	for _, want := range []string{"images.repository registry.example.com/sandbox-executor", "templates[duo-gvisor].image registry.example.com/duo/ci:bookworm",
		"pools images registry.example.com/duo/ci:bookworm", "gitlab.url https://gitlab.example.com", "gitlab.cidrs 192.0.2.10/32", "jobDefaults.fence 192.0.2.10:443",
		"kubectl label namespace ci-sandbox pod-security.kubernetes.io/enforce=privileged"} {
		if !strings.Contains(notes, want) {
			t.Errorf("NOTES.txt does not name %q:\n%s", want, notes)
		}
	}
	set := helmchart.Notes(t, "ci", "ci-sandbox", `
images: {repository: registry.corp.example/sandbox-executor}
gitlab: {url: "https://gitlab.corp.example"}
templates: [{name: duo-gvisor, image: "registry.corp.example/ci:1", egress: proxied}]
pools: [{name: duo-default, template: duo-gvisor, images: ["registry.corp.example/ci:1"]}]
`)
	if strings.Contains(set, "WARNING") {
		t.Errorf("NOTES.txt warns with every value set:\n%s", set)
	}
}

func envOf(c corev1.Container) map[string]string {
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	return env
}

// egressTo reports whether a rule opens cidr at port.
func egressTo(rules []networkingv1.NetworkPolicyEgressRule, cidr string, port int) bool {
	return slices.ContainsFunc(rules, func(r networkingv1.NetworkPolicyEgressRule) bool {
		return slices.ContainsFunc(r.To, func(p networkingv1.NetworkPolicyPeer) bool { return p.IPBlock != nil && p.IPBlock.CIDR == cidr }) &&
			slices.ContainsFunc(r.Ports, func(p networkingv1.NetworkPolicyPort) bool { return p.Port.IntValue() == port })
	})
}

// mountsSecretKeyAt reports whether a pod's first container sees key of Secret secret at path,
// from a secret volume or a projected one.
func mountsSecretKeyAt(pod corev1.PodSpec, secret, key, path string) bool {
	for _, m := range pod.Containers[0].VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name != m.Name {
				continue
			}
			var items []corev1.KeyToPath
			if v.Secret != nil && v.Secret.SecretName == secret {
				items = v.Secret.Items
			}
			if v.Projected != nil {
				for _, s := range v.Projected.Sources {
					if s.Secret != nil && s.Secret.Name == secret {
						items = append(items, s.Secret.Items...)
					}
				}
			}
			for _, it := range items {
				if it.Key == key && m.MountPath+"/"+it.Path == path {
					return true
				}
			}
		}
	}
	return false
}

// The executor names the admin token only when it has proxied pools to grant for: an install
// without them keeps a config that older executors load.
func TestEgressAdminTokenOnlyForProxiedPools(t *testing.T) {
	objs := helmchart.Render(t, "ci", "ci-sandbox", `
gitlab: {cidrs: [192.0.2.10/32]}
templates: [{name: duo-gvisor, image: "r.example/ci:1", egress: direct}]
`)
	var cm corev1.ConfigMap
	objs.Decode(t, "ConfigMap", "ci-sandbox-executor-config", &cm)
	if strings.Contains(cm.Data["config.toml"], "egress_admin_token_file") {
		t.Errorf("no pool is proxied, yet the executor config names the admin token:\n%s", cm.Data["config.toml"])
	}
}

// A pod that runs as a non-root user and mounts a Secret readable by its owner and group only
// must set fsGroup: the kubelet makes such files root-owned otherwise, and the process cannot
// read them (the egress proxy crash-looped on its admin token so).
func TestNonRootPodsCanReadTheirSecrets(t *testing.T) {
	objs := helmchart.Render(t, "ci", "ci-sandbox", `
gitlab: {url: "https://gitlab.corp.example"}
runner: {secret: my-token}
templates: [{name: duo-gvisor, image: "registry.corp.example/ci:1", egress: proxied}]
pools: [{name: duo-default, template: duo-gvisor, replicas: 2, images: ["registry.corp.example/ci:1"], egressInstance: true}]
exporter: {enabled: true}
`)
	checked := 0
	for _, kind := range []string{"Deployment", "Job", "CronJob"} {
		for _, obj := range objs.OfKind(kind) {
			path := []string{"spec", "template", "spec"}
			if kind == "CronJob" {
				path = []string{"spec", "jobTemplate", "spec", "template", "spec"}
			}
			var spec corev1.PodSpec
			raw, _, _ := unstructured.NestedMap(obj.Object, path...)
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &spec); err != nil {
				t.Fatal(err)
			}
			sc := spec.SecurityContext
			if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
				continue
			}
			for _, v := range spec.Volumes {
				if v.Secret == nil || v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o004 != 0 {
					continue
				}
				checked++
				if sc.FSGroup == nil {
					t.Errorf("%s %s runs as uid %d and mounts Secret %s mode %#o without fsGroup: it cannot read it", kind, obj.GetName(), *sc.RunAsUser, v.Secret.SecretName, *v.Secret.DefaultMode)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no non-root pod with a private Secret was rendered: the test checks nothing")
	}
}
