package chart_test

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/helmchart"
)

// images.agentVolume: job pods get the agent either from the agent image mounted read-only as an
// image volume (no install-agent init container: one container start less per pod, nothing
// copied) or copied by install-agent into an emptyDir; auto picks the image volume where
// ImageVolume is GA (Kubernetes 1.36). Either way the job container runs wire.PodAgentPath from
// a read-only mount at wire.BakedDir, which is what the executor and doctor recognise.
func TestAgentVolumeModes(t *testing.T) {
	const agentImage = "registry.example.com/se/sandbox-executor-agent:v1"
	values := func(mode string) string {
		return "images: {agent: " + agentImage + ", agentVolume: " + mode + "}\n" + `
templates:
  - {name: fenced, image: ci:1, egress: proxied}
  - {name: open, image: ci:1, egress: proxied, netstackFence: false}
pools:
  - {name: p, template: fenced, replicas: 1, images: ["ci:1"]}
executor: {defaultPool: p}
`
	}
	for _, tc := range []struct {
		mode, kubeVersion string
		fromImage         bool
	}{
		{"auto", "1.36.0", true},
		{"auto", "1.35.2", false},
		{"image", "1.35.2", true},
		{"copy", "1.36.0", false},
	} {
		out, err := helmchart.Template(t, "duo", "duo-ci", values(tc.mode), "--kube-version", tc.kubeVersion)
		if err != nil {
			t.Fatalf("agentVolume %s on %s: %v", tc.mode, tc.kubeVersion, err)
		}
		objs, err := helmchart.Parse(out)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"fenced", "open"} {
			var tmpl extv1beta1.SandboxTemplate
			objs.Decode(t, "SandboxTemplate", name, &tmpl)
			pod := tmpl.Spec.PodTemplate.Spec
			job := pod.Containers[0]
			if len(job.Command) == 0 || job.Command[0] != wire.PodAgentPath {
				t.Errorf("agentVolume %s on %s, template %s: job command %q, want %s", tc.mode, tc.kubeVersion, name, job.Command, wire.PodAgentPath)
			}
			if !slices.ContainsFunc(job.VolumeMounts, func(m corev1.VolumeMount) bool {
				return m.Name == "sandbox-executor-agent" && m.MountPath == wire.BakedDir && m.ReadOnly
			}) {
				t.Errorf("agentVolume %s on %s, template %s: the job container does not mount the agent read-only at %s: %+v", tc.mode, tc.kubeVersion, name, wire.BakedDir, job.VolumeMounts)
			}
			i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == "sandbox-executor-agent" })
			if i < 0 {
				t.Fatalf("agentVolume %s on %s, template %s: no sandbox-executor-agent volume", tc.mode, tc.kubeVersion, name)
			}
			installs := slices.ContainsFunc(pod.InitContainers, func(c corev1.Container) bool { return c.Name == "install-agent" })
			fenced := slices.ContainsFunc(pod.InitContainers, func(c corev1.Container) bool { return c.Name == "netfence" })
			if fenced != (name == "fenced") {
				t.Errorf("agentVolume %s on %s, template %s: netfence init container present %t", tc.mode, tc.kubeVersion, name, fenced)
			}
			if v := pod.Volumes[i]; tc.fromImage {
				if v.Image == nil || v.Image.Reference != agentImage || v.EmptyDir != nil || installs {
					t.Errorf("agentVolume %s on %s, template %s: want the agent image %s as the volume and no install-agent; volume %+v, install-agent %t", tc.mode, tc.kubeVersion, name, agentImage, v.VolumeSource, installs)
				}
			} else if v.EmptyDir == nil || v.Image != nil || !installs {
				t.Errorf("agentVolume %s on %s, template %s: want an emptyDir filled by install-agent; volume %+v, install-agent %t", tc.mode, tc.kubeVersion, name, v.VolumeSource, installs)
			}
		}
	}
	if _, err := helmchart.Template(t, "duo", "duo-ci", values("mount")); err == nil {
		t.Error("agentVolume mount was accepted; want the schema to refuse it")
	}
}
