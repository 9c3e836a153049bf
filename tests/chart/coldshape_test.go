package chart_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/agent/netfence"
	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/helmchart"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// The finding of issue 39 (item 1): a Sandbox created with the executor's ServiceAccount with no
// owner, no labels, the exact netfence init container and /bin/sh as the job container's command
// was admitted. agent-sandbox labels a pod with the template's ref hash, which the template's
// NetworkPolicy selects by, only from a Sandbox an extensions object controls, so no
// NetworkPolicy selected that pod; and with no agent holding 7543 and 7544, the netstack fence's
// reply rules let the job send from them to every port of every replyTo network. The policy now
// holds the whole shape: that Sandbox is refused, and so is each widening on its own, while the
// Sandbox the executor's own code makes (coldSandbox) is admitted.
func TestColdStartPolicyHoldsThePodTheNetworkPolicySelects(t *testing.T) {
	for _, values := range []string{"", "jobDefaults: {nonRoot: true}\n", "agentTLS: {enabled: false}\n", "images: {agentVolume: image}\n"} {
		vap, tmpl := coldPolicy(t, values)
		own := coldSandbox(t, tmpl)
		if denied := admit(t, vap, own); len(denied) > 0 {
			t.Fatalf("values %q: the executor's own cold start is refused: %q", values, denied)
		}

		finding := coldSandbox(t, tmpl)
		finding.OwnerReferences = nil
		finding.Labels = nil
		finding.Spec.PodTemplate.ObjectMeta.Labels = nil
		finding.Spec.PodTemplate.Spec.Containers[0].Command = []string{"/bin/sh", "-c", "sleep infinity"}
		netfenceOf(t, finding) // the exact netfence init container the policy requires, kept
		denied := strings.Join(admit(t, vap, finding), "\n")
		for _, want := range []string{"must be controlled by SandboxTemplate duo-gvisor", "must carry the label " + sandboxv1beta1.SandboxTemplateRefHashLabel,
			"must label their pod exactly as the cold template does", "must run the cold template's job command"} {
			if !strings.Contains(denied, want) {
				t.Errorf("values %q: the finding's Sandbox (no owner, no labels, /bin/sh) is denied by %q; want a denial saying %q", values, denied, want)
			}
		}

		job := func(s *sandboxv1beta1.Sandbox) *corev1.Container { return &s.Spec.PodTemplate.Spec.Containers[0] }
		initNamed := func(s *sandboxv1beta1.Sandbox, name string) *corev1.Container {
			for i := range s.Spec.PodTemplate.Spec.InitContainers {
				if s.Spec.PodTemplate.Spec.InitContainers[i].Name == name {
					return &s.Spec.PodTemplate.Spec.InitContainers[i]
				}
			}
			t.Fatalf("the cold template has no %s init container", name)
			return nil
		}
		dropEnv := func(c *corev1.Container, name string) {
			before := len(c.Env)
			c.Env = slicesDeleteEnv(c.Env, name)
			if len(c.Env) == before {
				t.Fatalf("values %q: the job container has no %s to remove", values, name)
			}
		}
		owned := "must be controlled by SandboxTemplate duo-gvisor"
		labelled := "must carry the label " + sandboxv1beta1.SandboxTemplateRefHashLabel
		podLabels := "must label their pod exactly as the cold template does"
		command := "must run the cold template's job command"
		dns := "must keep the cold template's DNS settings"
		inits := "must have the cold template's init containers as they are"
		type widening struct {
			name, want string
			widen      func(*sandboxv1beta1.Sandbox)
		}
		cases := []widening{
			{"no owner", owned, func(s *sandboxv1beta1.Sandbox) { s.OwnerReferences = nil }},
			{"an owner that is not the controller", owned, func(s *sandboxv1beta1.Sandbox) { s.OwnerReferences[0].Controller = nil }},
			{"controlled by another template", owned, func(s *sandboxv1beta1.Sandbox) { s.OwnerReferences[0].Name = "duo-open" }},
			{"controlled by a SandboxClaim", owned, func(s *sandboxv1beta1.Sandbox) { s.OwnerReferences[0].Kind = "SandboxClaim" }},
			{"a second owner", owned, func(s *sandboxv1beta1.Sandbox) {
				s.OwnerReferences = append(s.OwnerReferences, metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "u"})
			}},
			{"no labels", labelled, func(s *sandboxv1beta1.Sandbox) { s.Labels = nil }},
			{"another template's ref hash", labelled, func(s *sandboxv1beta1.Sandbox) {
				s.Labels[sandboxv1beta1.SandboxTemplateRefHashLabel] = kube.TemplateRefHash("duo-open")
			}},
			{"no pod labels", podLabels, func(s *sandboxv1beta1.Sandbox) { s.Spec.PodTemplate.ObjectMeta.Labels = nil }},
			{"a runner's pod labels", podLabels, func(s *sandboxv1beta1.Sandbox) {
				s.Spec.PodTemplate.ObjectMeta.Labels["app.kubernetes.io/name"] = "sandbox-executor-runner"
			}},
			{"another release's pod label", podLabels, func(s *sandboxv1beta1.Sandbox) {
				s.Spec.PodTemplate.ObjectMeta.Labels["app.kubernetes.io/instance"] = "other"
			}},
			{"an extra pod label", podLabels, func(s *sandboxv1beta1.Sandbox) { s.Spec.PodTemplate.ObjectMeta.Labels["team"] = "ops" }},
			{"command /bin/sh", command, func(s *sandboxv1beta1.Sandbox) { job(s).Command = []string{"/bin/sh"} }},
			{"no command (the image's entrypoint)", command, func(s *sandboxv1beta1.Sandbox) { job(s).Command = nil }},
			{"the agent with args", command, func(s *sandboxv1beta1.Sandbox) { job(s).Args = []string{"--listen", "127.0.0.1:7543"} }},
			{"the agent without its fence addresses (nothing on 7544)", command, func(s *sandboxv1beta1.Sandbox) {
				dropEnv(job(s), wire.FenceAllowEnv)
			}},
			{"an extra env var", command, func(s *sandboxv1beta1.Sandbox) {
				job(s).Env = append(job(s).Env, corev1.EnvVar{Name: "LD_PRELOAD", Value: "/tmp/x.so"})
			}},
			{"dnsPolicy None with nameservers", dns, func(s *sandboxv1beta1.Sandbox) {
				s.Spec.PodTemplate.Spec.DNSPolicy = corev1.DNSNone
				s.Spec.PodTemplate.Spec.DNSConfig = &corev1.PodDNSConfig{Nameservers: []string{"203.0.113.53"}}
			}},
			{"dnsPolicy Default (the node's resolvers)", dns, func(s *sandboxv1beta1.Sandbox) { s.Spec.PodTemplate.Spec.DNSPolicy = corev1.DNSDefault }},
			{"dnsConfig searches", dns, func(s *sandboxv1beta1.Sandbox) {
				s.Spec.PodTemplate.Spec.DNSConfig = &corev1.PodDNSConfig{Searches: []string{"kube-system.svc.cluster.local"}}
			}},
			{"a sidecar of the agent image", inits, func(s *sandboxv1beta1.Sandbox) {
				sidecar := *netfenceOf(t, s).DeepCopy()
				sidecar.Name, sidecar.Command, sidecar.Args, sidecar.RestartPolicy = "sidecar", []string{"/sandbox-executor-agent", "serve"}, nil, ptr.To(corev1.ContainerRestartPolicyAlways)
				sidecar.SecurityContext = job(s).SecurityContext.DeepCopy() // no NET_ADMIN: only the init-container rule refuses it
				s.Spec.PodTemplate.Spec.InitContainers = append(s.Spec.PodTemplate.Spec.InitContainers, sidecar)
			}},
			{"a netfence told it is a probe child (it writes no fence)", inits, func(s *sandboxv1beta1.Sandbox) {
				fence := netfenceOf(t, s)
				fence.Env = append(fence.Env, corev1.EnvVar{Name: netfence.ProbeRoleEnv, Value: "listen"})
			}},
		}
		if slices.ContainsFunc(own.Spec.PodTemplate.Spec.Volumes, func(v corev1.Volume) bool { return v.Image != nil }) {
			// images.agentVolume image: the agent comes from an image volume, not install-agent.
			volumes := "may have emptyDir volumes only, beside the agent image's"
			agentVolume := func(s *sandboxv1beta1.Sandbox) *corev1.ImageVolumeSource {
				i := slices.IndexFunc(s.Spec.PodTemplate.Spec.Volumes, func(v corev1.Volume) bool { return v.Image != nil })
				return s.Spec.PodTemplate.Spec.Volumes[i].Image
			}
			cases = append(cases,
				widening{"another image as the agent's volume", volumes, func(s *sandboxv1beta1.Sandbox) {
					agentVolume(s).Reference = "registry.example.com/tools/busybox:1"
				}},
				widening{"a second image volume", volumes, func(s *sandboxv1beta1.Sandbox) {
					s.Spec.PodTemplate.Spec.Volumes = append(s.Spec.PodTemplate.Spec.Volumes,
						corev1.Volume{Name: "tools", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "registry.example.com/tools/busybox:1"}}})
				}},
				widening{"an init container added to the image volume's pod", inits, func(s *sandboxv1beta1.Sandbox) {
					extra := *netfenceOf(t, s).DeepCopy()
					extra.Name, extra.Command, extra.Args = "install-agent", []string{"/sandbox-executor-agent", "install", "/opt/sandbox-executor/agent"}, nil
					s.Spec.PodTemplate.Spec.InitContainers = append(s.Spec.PodTemplate.Spec.InitContainers, extra)
				}})
		} else {
			cases = append(cases,
				widening{"install-agent as a sidecar", inits, func(s *sandboxv1beta1.Sandbox) {
					initNamed(s, "install-agent").RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
				}},
				widening{"install-agent running another command", inits, func(s *sandboxv1beta1.Sandbox) {
					initNamed(s, "install-agent").Command = []string{"/sandbox-executor-agent", "serve"}
				}},
				widening{"the fence after install-agent", inits, func(s *sandboxv1beta1.Sandbox) {
					ic := s.Spec.PodTemplate.Spec.InitContainers
					ic[0], ic[len(ic)-1] = ic[len(ic)-1], ic[0]
				}})
		}
		if strings.Contains(values, "agentTLS: {enabled: false}") {
			// Without the agent CA the agent does not listen on 7543 and the fence does not reply from it.
			if hasEnv(job(own), wire.ClientCAEnv) {
				t.Fatalf("agentTLS off: the job container still has %s", wire.ClientCAEnv)
			}
		} else {
			cases = append(cases, widening{"the agent without its CA (nothing on 7543)", command, func(s *sandboxv1beta1.Sandbox) {
				dropEnv(job(s), wire.ClientCAEnv)
			}})
		}
		for _, tc := range cases {
			sbx := coldSandbox(t, tmpl)
			tc.widen(sbx)
			if denied := admit(t, vap, sbx); !strings.Contains(strings.Join(denied, "\n"), tc.want) {
				t.Errorf("values %q, %s: denied by %q; want a denial saying %q", values, tc.name, denied, tc.want)
			}
		}
	}
}

// An update by the executor (its merge patch recording a job's outcome) may change annotations
// only: the shape rules hold the updated object, and the update rule holds it to the old one, so
// a patch cannot strip the owner or the labels, or change the pod.
func TestColdStartPolicyHoldsUpdates(t *testing.T) {
	vap, tmpl := coldPolicy(t, "")
	old := coldSandbox(t, tmpl)
	outcome := old.DeepCopy()
	outcome.Annotations[kube.AnnotationOutcome] = "success"
	if denied := review(t, vap, old, outcome); len(denied) > 0 {
		t.Fatalf("recording the job's outcome is refused: %q", denied)
	}
	unchanged := "may change only the annotations of its cold Sandboxes"
	for _, tc := range []struct {
		name  string
		apply func(*sandboxv1beta1.Sandbox)
	}{
		{"the owner stripped", func(s *sandboxv1beta1.Sandbox) { s.OwnerReferences = nil }},
		{"the labels removed", func(s *sandboxv1beta1.Sandbox) { s.Labels = nil }},
		{"another job's labels", func(s *sandboxv1beta1.Sandbox) { s.Labels[kube.LabelJobID] = "1" }},
		{"the job command changed", func(s *sandboxv1beta1.Sandbox) {
			s.Spec.PodTemplate.Spec.Containers[0].Command = []string{"/bin/sh"}
		}},
		{"the lifetime extended", func(s *sandboxv1beta1.Sandbox) {
			later := metav1.NewTime(s.Spec.Lifecycle.ShutdownTime.Add(48 * time.Hour))
			s.Spec.Lifecycle.ShutdownTime = &later
		}},
	} {
		sbx := old.DeepCopy()
		tc.apply(sbx)
		if denied := review(t, vap, old, sbx); !strings.Contains(strings.Join(denied, "\n"), unchanged) {
			t.Errorf("an update with %s: denied by %q; want a denial saying %q", tc.name, denied, unchanged)
		}
	}
}

// The chart computes agent-sandbox's ref hash of the cold template's name itself (Sprig has no
// FNV): it must be kube.TemplateRefHash's, for any name.
func TestColdStartPolicyRefHashIsAgentSandboxs(t *testing.T) {
	for _, name := range []string{"duo-gvisor", "a", "cold.start-9", "z0123456789-abcdefghijklmnopqrstuvwxyz.0123456789-abcdefghijkl"} {
		values := "coldStart: {enabled: true, template: " + name + "}\nexecutor: {unknownImage: cold}\n" +
			"templates: [{name: duo-gvisor, image: registry.example.com/duo/ci:bookworm, egress: proxied}" +
			map[bool]string{true: "", false: ", {name: " + name + ", image: registry.example.com/duo/ci:bookworm, egress: proxied}"}[name == "duo-gvisor"] + "]\n"
		objs := helmchart.Render(t, "duo", "duo-ci", values)
		vap, tmpl := coldPolicyOf(t, objs, name)
		want := strconv.Quote(kube.TemplateRefHash(name))
		found := false
		for _, v := range vap.Spec.Validations {
			if strings.Contains(v.Message, sandboxv1beta1.SandboxTemplateRefHashLabel) {
				found = true
				if !strings.Contains(v.Expression, want) {
					t.Errorf("template %q: the policy's label rule %q; want the ref hash %s", name, v.Expression, want)
				}
			}
		}
		if !found {
			t.Errorf("template %q: the policy has no rule on the %s label", name, sandboxv1beta1.SandboxTemplateRefHashLabel)
		}
		if denied := admit(t, vap, coldSandbox(t, tmpl)); len(denied) > 0 {
			t.Errorf("template %q: the executor's own cold start is refused: %q", name, denied)
		}
	}
}

func hasEnv(c *corev1.Container, name string) bool {
	for _, e := range c.Env {
		if e.Name == name {
			return true
		}
	}
	return false
}

func slicesDeleteEnv(env []corev1.EnvVar, name string) []corev1.EnvVar {
	var out []corev1.EnvVar
	for _, e := range env {
		if e.Name != name {
			out = append(out, e)
		}
	}
	return out
}
