//go:build e2e

package e2e

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	sandboxclient "sigs.k8s.io/agent-sandbox/clients/k8s/clientset/versioned"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
)

// coldRunner serves the CI image from its warm pool and nothing else; unknown_image = "cold"
// cold-starts the POSIX image (served by no pool here) from the CI pool's template. Each test
// names its runner (prefix-PID) on its own: gc counts a runner's claims and cold starts, and the
// tests run concurrently.
func coldRunner(t *testing.T, prefix string) *clusterjobs.Runner {
	t.Helper()
	c := clusterjobs.Connect(t)
	return c.NewRunner(t, prefix, `unknown_image = "cold"
cold_template = "`+localcluster.Template+`"
cold_images = ["sandbox-executor.local/posix:*"]`,
		clusterjobs.Pool{Name: localcluster.Pool, Images: []string{localcluster.CIImage}})
}

// An image no pool serves but cold_images allows runs in a Sandbox created from cold_template with
// that image, under gVisor and the template's NetworkPolicy; the job log says it is a cold start;
// cleanup removes the Sandbox and its pod.
func TestColdImageStartsASandboxFromTheTemplate(t *testing.T) {
	t.Parallel()
	r := coldRunner(t, "e2e-cold-start")
	j := r.NewJob(t, clusterjobs.JobSpec{Image: localcluster.PosixImage})
	prep := j.Prepare(t)
	t.Log(prep.Output())
	mustContain(t, "prepare log", prep.Output(),
		`Image sandbox-executor.local/posix:bookworm is served by no warm pool: cold start of a sandbox from template duo-gvisor (unknown_image = "cold")`,
		"Sandbox ready: template duo-gvisor (cold start: no warm pool serves the image)", "runtime gvisor")
	ctx := context.Background()
	if _, err := j.Admin.Extensions.ExtensionsV1beta1().SandboxClaims(clusterjobs.Namespace).Get(ctx, j.ClaimName(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a cold start made a claim: %v", err)
	}
	sbx, err := j.Admin.Sandboxes.AgentsV1beta1().Sandboxes(clusterjobs.Namespace).Get(ctx, j.ClaimName(), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the job's Sandbox: %v", err)
	}
	for k, v := range map[string]string{kube.LabelManagedBy: kube.ManagedByValue, kube.LabelRunner: kube.RunnerLabel(r.Name),
		kube.LabelJobID: strconv.FormatInt(j.ID, 10), kube.LabelProjectID: "42", kube.LabelPipelineID: "4242"} {
		if sbx.Labels[k] != v {
			t.Errorf("Sandbox label %s = %q, want %q", k, sbx.Labels[k], v)
		}
	}
	if lc := sbx.Spec.Lifecycle; lc.ShutdownTime == nil || lc.ShutdownPolicy == nil || *lc.ShutdownPolicy != sandboxv1beta1.ShutdownPolicyDelete {
		t.Errorf("Sandbox lifecycle %+v: want a shutdownTime with policy Delete", lc)
	}
	pod := j.PodObject(t)
	job := pod.Spec.Containers[0]
	// The template's only variables are the fence's addresses and the agent CA's certificate
	// (public, from a ConfigMap): nothing of the job's travels in the pod spec.
	fenceOnly := func(name string) bool {
		return name == wire.FenceDenyEnv || name == wire.FenceAllowEnv || name == wire.FenceTimeoutEnv || name == wire.FenceNetstackEnv || name == wire.ClientCAEnv
	}
	if job.Image != localcluster.PosixImage || slices.ContainsFunc(job.Env, func(e corev1.EnvVar) bool { return !fenceOnly(e.Name) }) || len(job.EnvFrom) != 0 {
		t.Errorf("job container: image %s, env %v %v; want the job's image and no env but the fence's and the agent CA's", job.Image, job.Env, job.EnvFrom)
	}
	assertSelectedByTemplateNetworkPolicy(t, j, pod)

	out := j.MustRun(t, "echo \"bash-$(test -e /bin/bash && echo present || echo absent)\"\ncat /proc/version\n").Output()
	mustContain(t, "stage output", out, "bash-absent", "gvisor")

	if gc := j.MustStage(t, 0, "gc").Output(); !strings.Contains(gc, "0 of 1 claims and cold-started Sandboxes of runner") {
		t.Errorf("gc (dry run) does not list the cold start as this runner's, not expired:\n%s", gc)
	}
	j.Cleanup(t) // waits until the Sandbox and its pod are gone
}

// assertSelectedByTemplateNetworkPolicy: the template's managed NetworkPolicy selects the
// cold-started pod, as it selects the pool's: its egress allow-list applies.
func assertSelectedByTemplateNetworkPolicy(t *testing.T, j *clusterjobs.Job, pod *corev1.Pod) {
	t.Helper()
	policy, err := j.Admin.Kube.NetworkingV1().NetworkPolicies(clusterjobs.Namespace).Get(context.Background(), localcluster.Template+"-network-policy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range policy.Spec.PodSelector.MatchLabels {
		if pod.Labels[k] != v {
			t.Errorf("NetworkPolicy %s selects %s=%s; the cold-started pod has %q", policy.Name, k, v, pod.Labels[k])
		}
	}
	if len(policy.Spec.PodSelector.MatchLabels) == 0 {
		t.Errorf("NetworkPolicy %s selects no label", policy.Name)
	}
}

// An image allowed neither by a pool nor by cold_images fails prepare as a build failure, one
// line naming both lists, and creates nothing.
func TestColdImageRefusesUnlistedImage(t *testing.T) {
	t.Parallel()
	r := coldRunner(t, "e2e-cold-refuse")
	j := r.NewJob(t, clusterjobs.JobSpec{Image: "sandbox-executor.local/unlisted:latest"})
	res := j.PrepareRefused(t)
	if res.ExitCode != clusterjobs.BuildFailure {
		t.Fatalf("prepare exited %d, want BUILD_FAILURE (%d)\n%s", res.ExitCode, clusterjobs.BuildFailure, res.Output())
	}
	msg := strings.TrimSpace(res.Output())
	mustContain(t, "prepare output", msg, `image not allowed: "sandbox-executor.local/unlisted:latest"`, "no pool runs it (pool "+localcluster.Pool+" serves "+localcluster.CIImage+")",
		`cold starts (unknown_image = "cold") allow sandbox-executor.local/posix:*`)
	if strings.Contains(msg, "\n") {
		t.Errorf("not one line:\n%s", msg)
	}
	ctx := context.Background()
	if _, err := j.Admin.Sandboxes.AgentsV1beta1().Sandboxes(clusterjobs.Namespace).Get(ctx, j.ClaimName(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a refused image got a Sandbox: %v", err)
	}
	if _, err := j.Admin.Extensions.ExtensionsV1beta1().SandboxClaims(clusterjobs.Namespace).Get(ctx, j.ClaimName(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a refused image got a claim: %v", err)
	}
}

// The chart's cold-start admission policy (coldStart.enabled): the executor's ServiceAccount may
// create a Sandbox like the ones ColdStart makes, and nothing that leaves gVisor (server-side dry
// runs).
func TestColdImageAdmissionPolicy(t *testing.T) {
	t.Parallel()
	c := clusterjobs.Connect(t)
	ctx := context.Background()
	sandboxes, err := sandboxclient.NewForConfig(clusterjobs.RESTConfig(t, c.ExecutorKubeconfig()))
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := c.Admin.Extensions.ExtensionsV1beta1().SandboxTemplates(clusterjobs.Namespace).Get(ctx, localcluster.Template, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	create := func(edit func(*corev1.PodSpec)) error {
		// Owned and labelled as kube.ColdStart makes it: the policy holds both (issue 39).
		hash, controller := kube.TemplateRefHash(tmpl.Name), true
		sbx := &sandboxv1beta1.Sandbox{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-cold-policy-", Namespace: clusterjobs.Namespace,
			Labels: map[string]string{kube.LabelManagedBy: kube.ManagedByValue, kube.LabelRunner: kube.RunnerLabel("e2e-cold-policy"), kube.LabelJobID: "1",
				sandboxv1beta1.SandboxTemplateRefHashLabel: hash, sandboxv1beta1.SandboxLaunchTypeLabel: sandboxv1beta1.SandboxLaunchTypeCold},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: extv1beta1.GroupVersion.String(), Kind: extv1beta1.SandboxTemplateKind,
				Name: tmpl.Name, UID: tmpl.UID, Controller: &controller}}}}
		sbx.Spec.SandboxBlueprint = *tmpl.Spec.SandboxBlueprint.DeepCopy()
		if sbx.Spec.PodTemplate.ObjectMeta.Labels == nil {
			sbx.Spec.PodTemplate.ObjectMeta.Labels = map[string]string{}
		}
		sbx.Spec.PodTemplate.ObjectMeta.Labels[sandboxv1beta1.SandboxTemplateRefHashLabel] = hash
		edit(&sbx.Spec.PodTemplate.Spec)
		_, err := sandboxes.AgentsV1beta1().Sandboxes(clusterjobs.Namespace).Create(ctx, sbx, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	if err := create(func(*corev1.PodSpec) {}); err != nil {
		t.Fatalf("the template's own Sandbox, as the executor: %v", err)
	}
	runc, yes := "runc", true
	for name, edit := range map[string]func(*corev1.PodSpec){
		"runtimeClassName runc":  func(s *corev1.PodSpec) { s.RuntimeClassName = &runc },
		"no runtimeClassName":    func(s *corev1.PodSpec) { s.RuntimeClassName = nil },
		"a ServiceAccount token": func(s *corev1.PodSpec) { s.AutomountServiceAccountToken = &yes },
		"another ServiceAccount": func(s *corev1.PodSpec) { s.ServiceAccountName = "sandbox-executor" },
		"the node's network":     func(s *corev1.PodSpec) { s.HostNetwork = true },
	} {
		if err := create(edit); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "sandboxes created by sandbox-executor must") {
			t.Errorf("%s, as the executor: %v; want the admission policy to refuse it", name, err)
		}
	}
}
