package chart_test

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/helmchart"
)

// templateNetfence is a rendered template's netstack fence init container, nil without one.
func templateNetfence(t *testing.T, objs *helmchart.Objects, name string) (*corev1.Container, *extv1beta1.SandboxTemplate) {
	t.Helper()
	var tmpl extv1beta1.SandboxTemplate
	objs.Decode(t, "SandboxTemplate", name, &tmpl)
	for i, c := range tmpl.Spec.PodTemplate.Spec.InitContainers {
		if c.Name == "netfence" {
			return &tmpl.Spec.PodTemplate.Spec.InitContainers[i], &tmpl
		}
	}
	return nil, &tmpl
}

// Every baked template writes its egress into the sandbox's own iptables before the job starts,
// from an init container that alone holds NET_ADMIN and NET_RAW; the job container holds
// neither. What it allows is what the template's NetworkPolicy allows (issue 26, item 0).
func TestNetstackFenceMirrorsEachTemplatesEgress(t *testing.T) {
	objs := helmchart.Render(t, "duo", "duo-ci", `
gitlab: {cidrs: [10.20.0.5/32, "2001:db8::5/128"], ports: [443, 22]}
jobDefaults: {netstackFence: {replyTo: [10.244.0.0/16]}}
templates:
  - {name: proxied, image: ci:1, egress: proxied}
  - {name: direct, image: ci:1, egress: direct}
  - {name: closed, image: ci:1, egress: none}
  - {name: ruled, image: ci:1, egress: proxied, proxyURL: "http://10.1.2.3:3128", egressRules: [{to: [{ipBlock: {cidr: 10.1.2.3/32}}], ports: [{protocol: TCP, port: 3128}]}]}
  - {name: optout, image: ci:1, egress: direct, netstackFence: false}
  - {name: copied, image: ci:1, egress: none, bakeAgent: false}
pools:
  - {name: p, template: proxied, replicas: 1, images: ["ci:1"]}
executor: {defaultPool: p}
`)
	replyTo := []string{"--reply-to", "10.244.0.0/16", "--reply-port", "7543", "--reply-port", "7544"}
	for name, want := range map[string][]string{
		"proxied": {"--allow-dns", "--allow-host", "duo-sandbox-executor-egress-proxy.duo-ci.svc:3128"},
		"direct":  {"--allow-dns", "--allow", "10.20.0.5/32:443", "--allow", "10.20.0.5/32:22", "--allow", "2001:db8::5/128:443", "--allow", "2001:db8::5/128:22"},
		"closed":  nil,
		"ruled":   {"--allow", "10.1.2.3/32:3128/tcp"},
	} {
		fence, tmpl := templateNetfence(t, objs, name)
		if fence == nil {
			t.Errorf("template %s has no netfence init container", name)
			continue
		}
		if want := slices.Concat([]string{"netfence"}, replyTo, want); !slices.Equal(fence.Args, want) {
			t.Errorf("template %s: netfence args %q, want %q", name, fence.Args, want)
		}
		sc := fence.SecurityContext
		if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 0 || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"NET_ADMIN", "NET_RAW"}) {
			t.Errorf("template %s: netfence securityContext %+v: want root with exactly NET_ADMIN and NET_RAW, all else dropped, no escalation", name, sc)
		}
		// Its one-line failure (an old runsc, a missing capability) is what doctor reads.
		if fence.TerminationMessagePolicy != corev1.TerminationMessageFallbackToLogsOnError {
			t.Errorf("template %s: netfence terminationMessagePolicy %q, want FallbackToLogsOnError", name, fence.TerminationMessagePolicy)
		}
		if tmpl.Spec.PodTemplate.Spec.InitContainers[0].Name != "netfence" {
			t.Errorf("template %s: netfence is not the first init container", name)
		}
		for _, c := range tmpl.Spec.PodTemplate.Spec.Containers {
			if c.SecurityContext != nil && c.SecurityContext.Capabilities != nil &&
				slices.ContainsFunc(c.SecurityContext.Capabilities.Add, func(c corev1.Capability) bool { return strings.HasPrefix(string(c), "NET_") }) {
				t.Errorf("template %s: container %s adds %v", name, c.Name, c.SecurityContext.Capabilities.Add)
			}
		}
		// The fence check proves the table too (its witness).
		if got := envOf(tmpl.Spec.PodTemplate.Spec.Containers[0])[wire.FenceNetstackEnv]; got != "true" {
			t.Errorf("template %s: %s=%q, want true", name, wire.FenceNetstackEnv, got)
		}
	}
	// Opted out, or an agent copied in at prepare (nothing would hold the reply ports): none,
	// and no check of a table that is not there.
	for _, name := range []string{"optout", "copied"} {
		fence, tmpl := templateNetfence(t, objs, name)
		if fence != nil {
			t.Errorf("template %s has a netfence init container: %q", name, fence.Args)
		}
		if got := envOf(tmpl.Spec.PodTemplate.Spec.Containers[0])[wire.FenceNetstackEnv]; got != "" {
			t.Errorf("template %s: %s=%q without a netstack fence", name, wire.FenceNetstackEnv, got)
		}
	}
	objs = helmchart.Render(t, "duo", "duo-ci", "jobDefaults: {netstackFence: {enabled: false}}\n")
	if fence, _ := templateNetfence(t, objs, "duo-gvisor"); fence != nil {
		t.Errorf("jobDefaults.netstackFence.enabled false still renders netfence: %q", fence.Args)
	}
}

// What the netstack fence cannot mirror is refused at render time, in one line naming the way out.
func TestNetstackFenceRefusesWhatItCannotMirror(t *testing.T) {
	for _, tc := range []struct{ name, values, want string }{
		{"a pod selector", `templates: [{name: duo-gvisor, image: ci:1, egressRules: [{to: [{podSelector: {matchLabels: {app: x}}}], ports: [{port: 80}]}]}]`,
			"templates[duo-gvisor].egressRules[0]: the netstack fence mirrors only ipBlock peers without except; use ipBlock, or set templates[duo-gvisor].netstackFence: false"},
		{"an except", `templates: [{name: duo-gvisor, image: ci:1, egressRules: [{to: [{ipBlock: {cidr: 0.0.0.0/0, except: [10.0.0.0/8]}}], ports: [{port: 443}]}]}]`,
			"the netstack fence mirrors only ipBlock peers without except"},
		{"every port", `templates: [{name: duo-gvisor, image: ci:1, egressRules: [{to: [{ipBlock: {cidr: 10.1.0.0/16}}]}]}]`,
			"templates[duo-gvisor].egressRules[0]: the netstack fence mirrors only rules with both to (ipBlock) and ports"},
		{"no baked agent", `templates: [{name: duo-gvisor, image: ci:1, bakeAgent: false, netstackFence: true}]`,
			"templates[duo-gvisor].netstackFence needs bakeAgent"},
		{"no reply networks", `jobDefaults: {netstackFence: {replyTo: []}}`, "replyTo"},
		{"every IPv4 address", `jobDefaults: {netstackFence: {replyTo: [10.88.0.0/16, 0.0.0.0/0]}}`, "/jobDefaults/netstackFence/replyTo/1"},
		{"every IPv6 address", `jobDefaults: {netstackFence: {replyTo: ["::/0"]}}`, "/jobDefaults/netstackFence/replyTo/0"},
		{"every IPv6 address, written long", `jobDefaults: {netstackFence: {replyTo: ["0:0::0/0"]}}`, "/jobDefaults/netstackFence/replyTo/0"},
	} {
		_, err := helmchart.Template(t, "duo", "duo-ci", tc.values+"\n")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: helm template said %v; want an error containing %q", tc.name, err, tc.want)
		}
	}
	// Past the schema, the templates name the fix.
	_, err := helmchart.Template(t, "duo", "duo-ci", "jobDefaults: {netstackFence: {replyTo: [0.0.0.0/0]}}\n", "--skip-schema-validation")
	if want := "jobDefaults.netstackFence.replyTo 0.0.0.0/0 is every address: name the networks"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("replyTo 0.0.0.0/0 without the schema: helm template said %v; want an error containing %q", err, want)
	}
}

// The netstack fence lets replies out only from the ports the baked agent listens on (issue 39):
// the readiness probe's 7544 always, the network transport's 7543 only with agentTLS, which alone
// gives the pod the agent CA the agent needs to listen there. With agentTLS off, a reply rule for
// 7543 would let any job process bind the free port and connect to every replyTo network. The
// cold-start policy holds a cold-started pod to the same args: one that adds 7543 is refused.
func TestNetstackFenceRepliesOnlyFromTheAgentsListeningPorts(t *testing.T) {
	for _, tls := range []bool{true, false} {
		values := fmt.Sprintf(`agentTLS: {enabled: %t}
gitlab: {cidrs: [10.20.0.5/32], ports: [443]}
jobDefaults: {netstackFence: {replyTo: [10.244.0.0/16, "fd00:244::/64"]}}
coldStart: {enabled: true, template: direct}
executor: {unknownImage: cold, defaultPool: p}
templates:
  - {name: direct, image: ci:1, egress: direct}
  - {name: proxied, image: ci:1, egress: proxied}
  - {name: closed, image: ci:1, egress: none}
  - {name: nonroot, image: ci:1, egress: none, nonRoot: true}
pools:
  - {name: p, template: direct, replicas: 1, images: ["ci:1"]}
`, tls)
		objs := helmchart.Render(t, "duo", "duo-ci", values)
		replyTo := []string{"netfence", "--reply-to", "10.244.0.0/16", "--reply-to", "fd00:244::/64"}
		wantPorts := []string{"--reply-port", "7544"}
		if tls {
			wantPorts = []string{"--reply-port", "7543", "--reply-port", "7544"}
		}
		for _, name := range []string{"direct", "proxied", "closed", "nonroot"} {
			fence, tmpl := templateNetfence(t, objs, name)
			if fence == nil {
				t.Errorf("agentTLS %t: template %s has no netfence init container", tls, name)
				continue
			}
			// The reply args follow --reply-to: every --reply-port, and nothing else between.
			want := slices.Concat(replyTo, wantPorts)
			if len(fence.Args) < len(want) || !slices.Equal(fence.Args[:len(want)], want) || slices.Contains(fence.Args[len(want):], "--reply-port") {
				t.Errorf("agentTLS %t: template %s: netfence args %q, want them to begin %q and name no other --reply-port", tls, name, fence.Args, want)
			}
			// What the agent serves: 7543 with the agent CA in its environment, 7544 for the
			// readiness probe.
			job := tmpl.Spec.PodTemplate.Spec.Containers[0]
			hasCA := slices.ContainsFunc(job.Env, func(e corev1.EnvVar) bool { return e.Name == wire.ClientCAEnv })
			if hasCA != tls || hasCA != slices.Contains(fence.Args, strconv.Itoa(wire.NetworkPort)) {
				t.Errorf("agentTLS %t: template %s: the job container has %s: %t, the fence replies from %d: %t; want both %t",
					tls, name, wire.ClientCAEnv, hasCA, wire.NetworkPort, slices.Contains(fence.Args, strconv.Itoa(wire.NetworkPort)), tls)
			}
			if probe := job.ReadinessProbe; probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Port.IntValue() != wire.FencePort {
				t.Errorf("agentTLS %t: template %s: readiness probe %+v, want httpGet on %d, the fence's other reply port", tls, name, probe, wire.FencePort)
			}
		}
		vap, tmpl := coldPolicyOf(t, objs, "direct")
		if denied := admit(t, vap, coldSandbox(t, tmpl)); len(denied) > 0 {
			t.Fatalf("agentTLS %t: the executor's own cold start is refused: %q", tls, denied)
		}
		if !tls {
			sbx := coldSandbox(t, tmpl)
			fence := netfenceOf(t, sbx)
			fence.Args = slices.Insert(fence.Args, len(replyTo), "--reply-port", "7543")
			if denied := admit(t, vap, sbx); !strings.Contains(strings.Join(denied, "\n"), "netfence init container") {
				t.Errorf("agentTLS false: a cold start whose fence replies from 7543 (%q) is denied by %q; want the netfence denial", fence.Args, denied)
			}
		}
	}
}

// The fence probe's period is the admin's (jobDefaults.fence.probePeriodSeconds, or a template's
// fence): how long a warm pod whose fence stopped holding may stay Ready, against what a fresh
// check costs every warm gVisor pod (docs/security.md). 2 s unless set; a template's fence that
// does not name it keeps the default's; the schema refuses what the kubelet would not take.
func TestFenceProbePeriodIsTheAdminsChoice(t *testing.T) {
	values := `
templates:
  - {name: plain, image: ci:1, egress: none}
  - {name: own, image: ci:1, egress: none, fence: {deny: ["10.0.0.1:80"], probePeriodSeconds: 5}}
  - {name: denyonly, image: ci:1, egress: none, fence: {deny: ["10.0.0.1:80"]}}
pools:
  - {name: p, template: plain, replicas: 1, images: ["ci:1"]}
executor: {defaultPool: p}
`
	for _, tc := range []struct {
		defaults string
		want     map[string]int32
	}{
		{"", map[string]int32{"plain": 2, "own": 5, "denyonly": 2}},
		{"jobDefaults: {fence: {deny: [\"169.254.169.254:80\"], probePeriodSeconds: 10}}\n", map[string]int32{"plain": 10, "own": 5, "denyonly": 10}},
	} {
		objs := helmchart.Render(t, "duo", "duo-ci", tc.defaults+values)
		for name, want := range tc.want {
			var tmpl extv1beta1.SandboxTemplate
			objs.Decode(t, "SandboxTemplate", name, &tmpl)
			probe := tmpl.Spec.PodTemplate.Spec.Containers[0].ReadinessProbe
			if probe == nil || probe.PeriodSeconds != want {
				t.Errorf("%q: template %s: readiness probe %+v, want periodSeconds %d", tc.defaults, name, probe, want)
			}
		}
	}
	for _, bad := range []string{"0", "-2", "1.5", `"2s"`, "301"} {
		_, err := helmchart.Template(t, "duo", "duo-ci", "jobDefaults: {fence: {probePeriodSeconds: "+bad+"}}\n")
		if err == nil || !strings.Contains(err.Error(), "probePeriodSeconds") {
			t.Errorf("probePeriodSeconds %s: helm template said %v; want the schema to refuse it", bad, err)
		}
	}
}
