//go:build security

package security

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
)

// executorServiceAccount is the user the chart's cold-start policy matches (templates/
// cold-images.yaml): the release's ServiceAccount, whose token tests/cluster/certs.sh puts in
// the executor kubeconfig.
const executorServiceAccount = "system:serviceaccount:" + clusterjobs.Namespace + ":sandbox-executor"

// coldPolicy is that ValidatingAdmissionPolicy of deploy/local's release.
const coldPolicy = "sandbox-executor-cold-images"

// TestColdSandboxPolicyRefusesWidenedPods creates Sandboxes on the real API server as the
// executor itself (its kubeconfig holds a token of the release's ServiceAccount, the user the
// cold-start ValidatingAdmissionPolicy matches: no impersonation), each a copy of the executor's
// own cold Sandbox, made by a real cold start (kube.ColdStart through prepare), widened in one
// way: each is refused with the policy's message. The widened ones are dry runs (admission runs,
// nothing is stored), so a policy that let one through starts no such pod on the shared
// cluster; the unchanged copy, dry run too, is admitted, which proves the refusals come from the
// changes, and the real cold start shows the executor's own Sandbox admitted (cleanup deletes it).
// Issue 39 adds the Sandbox no NetworkPolicy selects (no owner, no labels, /bin/sh) and each of
// its widenings, and the executor's own patch trying to strip the owner or the ref-hash label.
func TestColdSandboxPolicyRefusesWidenedPods(t *testing.T) {
	t.Parallel()
	c := clusterjobs.Connect(t)
	r := c.NewRunner(t, "sec-coldpolicy", `unknown_image = "cold"
cold_template = "`+localcluster.Template+`"
cold_images = ["`+localcluster.PosixImage+`"]`,
		clusterjobs.Pool{Name: localcluster.Pool, Images: []string{localcluster.CIImage}})
	ctx := context.Background()

	rc := clusterjobs.RESTConfig(t, c.ExecutorKubeconfig())
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	review, err := kc.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := review.Status.UserInfo.Username; got != executorServiceAccount {
		t.Fatalf("the executor kubeconfig authenticates as %q, not %q, the user the cold-start policy matches", got, executorServiceAccount)
	}

	// Which policy the cluster runs: the chart cluster-up installed may predate the allow-list.
	policy, err := c.Admin.Kube.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, coldPolicy, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the cold-start policy: %v", err)
	}
	if !slices.ContainsFunc(policy.Spec.Validations, func(v admissionv1.Validation) bool { return strings.Contains(v.Message, "emptyDir volumes only") }) {
		t.Errorf("the cluster's %s has no emptyDir-only rule: its chart predates issue 26's allow-list (re-run make cluster-up from this branch); the cases below show what it lets through", coldPolicy)
	}

	j := r.NewJob(t, clusterjobs.JobSpec{Image: localcluster.PosixImage})
	if prep := j.Prepare(t); !strings.Contains(prep.Output(), "cold start") {
		t.Fatalf("prepare did not cold-start the job's Sandbox:\n%s", prep.Output())
	}
	own, err := c.Admin.Sandboxes.AgentsV1beta1().Sandboxes(clusterjobs.Namespace).Get(ctx, j.ClaimName(), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the executor's cold Sandbox: %v", err)
	}
	sandboxes := r.Clients(t).Sandboxes.AgentsV1beta1().Sandboxes(clusterjobs.Namespace)
	create := func(t *testing.T, name string, widen func(*testing.T, *corev1.PodSpec), meta func(*sandboxv1beta1.Sandbox)) error {
		sbx := &sandboxv1beta1.Sandbox{
			ObjectMeta: metav1.ObjectMeta{Name: j.ClaimName() + "-" + name, Namespace: own.Namespace,
				Labels: maps.Clone(own.Labels), Annotations: maps.Clone(own.Annotations), OwnerReferences: slices.Clone(own.OwnerReferences)},
			Spec: *own.Spec.DeepCopy(),
		}
		widen(t, &sbx.Spec.PodTemplate.Spec)
		if meta != nil {
			meta(sbx)
		}
		_, err := sandboxes.Create(ctx, sbx, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	if err := create(t, "unchanged", func(*testing.T, *corev1.PodSpec) {}, nil); err != nil {
		t.Fatalf("positive control: a copy of the executor's own cold Sandbox was refused: %v", err)
	}
	// Whether the cluster runs issue 39's shape rules: without them the new cases below fail.
	if !slices.ContainsFunc(policy.Spec.Validations, func(v admissionv1.Validation) bool {
		return strings.Contains(v.Message, "must be controlled by SandboxTemplate")
	}) {
		t.Errorf("the cluster's %s has no owner or label rule: its chart predates issue 39 (re-run make cluster-up from this branch); the cases below show what it lets through", coldPolicy)
	}

	job := func(spec *corev1.PodSpec) *corev1.Container { return &spec.Containers[0] }
	noChange := func(*testing.T, *corev1.PodSpec) {}
	for _, tc := range []struct {
		name, message string
		widen         func(*testing.T, *corev1.PodSpec)
		meta          func(*sandboxv1beta1.Sandbox)
	}{
		{"hostpath", "may have emptyDir volumes only", func(t *testing.T, spec *corev1.PodSpec) {
			spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
			job(spec).VolumeMounts = append(job(spec).VolumeMounts, corev1.VolumeMount{Name: "host", MountPath: "/host"})
		}, nil},
		{"secret", "may have emptyDir volumes only", func(t *testing.T, spec *corev1.PodSpec) {
			spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "secret", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "sandbox-executor-egress-admin"}}})
			job(spec).VolumeMounts = append(job(spec).VolumeMounts, corev1.VolumeMount{Name: "secret", MountPath: "/secret"})
		}, nil},
		{"privileged", "may not be privileged", func(t *testing.T, spec *corev1.PodSpec) {
			privileged := true
			job(spec).SecurityContext.Privileged = &privileged
		}, nil},
		{"net-admin", "must drop ALL capabilities and add none but", func(t *testing.T, spec *corev1.PodSpec) {
			caps := job(spec).SecurityContext.Capabilities
			caps.Add = append(caps.Add, "NET_ADMIN")
		}, nil},
		{"no-netfence", "must keep the cold template's netfence init container", func(t *testing.T, spec *corev1.PodSpec) {
			before := len(spec.InitContainers)
			spec.InitContainers = slices.DeleteFunc(spec.InitContainers, func(c corev1.Container) bool { return c.Name == "netfence" })
			if len(spec.InitContainers) == before {
				t.Fatal("the executor's cold Sandbox has no netfence init container to remove: its template predates the netstack fence")
			}
		}, nil},
		// Issue 39, item 1: the Sandbox agent-sandbox gives no ref-hash label to its pod, which
		// no NetworkPolicy then selects, and a job command that leaves the fence's reply ports free.
		{"the-finding", "must be controlled by SandboxTemplate", func(t *testing.T, spec *corev1.PodSpec) {
			job(spec).Command = []string{"/bin/sh", "-c", "sleep 3600"}
		}, func(s *sandboxv1beta1.Sandbox) { s.OwnerReferences, s.Labels = nil, nil }},
		{"no-owner", "must be controlled by SandboxTemplate", noChange, func(s *sandboxv1beta1.Sandbox) { s.OwnerReferences = nil }},
		{"no-labels", "must carry the label " + sandboxv1beta1.SandboxTemplateRefHashLabel, noChange, func(s *sandboxv1beta1.Sandbox) { s.Labels = nil }},
		{"runner-pod-labels", "must label their pod exactly as the cold template does", noChange, func(s *sandboxv1beta1.Sandbox) {
			labels := maps.Clone(s.Spec.PodTemplate.ObjectMeta.Labels)
			labels["app.kubernetes.io/name"] = "sandbox-executor-runner"
			s.Spec.PodTemplate.ObjectMeta.Labels = labels
		}},
		{"command-sh", "must run the cold template's job command", func(t *testing.T, spec *corev1.PodSpec) {
			job(spec).Command = []string{"/bin/sh"}
		}, nil},
		{"dns-none", "must keep the cold template's DNS settings", func(t *testing.T, spec *corev1.PodSpec) {
			spec.DNSPolicy = corev1.DNSNone
			spec.DNSConfig = &corev1.PodDNSConfig{Nameservers: []string{"203.0.113.53"}}
		}, nil},
		{"sidecar", "must have the cold template's init containers as they are", func(t *testing.T, spec *corev1.PodSpec) {
			if len(spec.InitContainers) == 0 {
				t.Fatal("the executor's cold Sandbox has no init container (netfence) to copy")
			}
			// The agent image with the job container's own capabilities: only the init-container rule can refuse it.
			sidecar := *spec.InitContainers[0].DeepCopy()
			always := corev1.ContainerRestartPolicyAlways
			sidecar.Name, sidecar.Command, sidecar.Args, sidecar.RestartPolicy = "sidecar", []string{"/sandbox-executor-agent", "serve"}, nil, &always
			sidecar.SecurityContext = job(spec).SecurityContext.DeepCopy()
			spec.InitContainers = append(spec.InitContainers, sidecar)
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := create(t, tc.name, tc.widen, tc.meta)
			switch {
			case err == nil:
				t.Errorf("the API server admitted a cold Sandbox of the executor with %s", tc.name)
			case !strings.Contains(err.Error(), tc.message):
				t.Errorf("refused, but not by the cold-start policy's rule %q: %v", tc.message, err)
			default:
				t.Logf("refused as expected: %v", err)
			}
		})
	}

	// The executor's patch (recording the outcome) cannot strip what the shape rules hold: dry
	// runs on its own cold Sandbox; the outcome patch, the positive control, is admitted.
	patch := func(body string) error {
		_, err := sandboxes.Patch(ctx, own.Name, types.MergePatchType, []byte(body), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	if err := patch(fmt.Sprintf(`{"metadata":{"annotations":{%q:"success"}}}`, kube.AnnotationOutcome)); err != nil {
		t.Errorf("positive control: recording the outcome on the executor's cold Sandbox was refused: %v", err)
	}
	// Refused by the annotations-only policy (rbac.yaml) or by this one's update or shape rules,
	// whichever the API server reports first.
	refusals := []string{"may change only the annotations of its", "must be controlled by SandboxTemplate", "must carry the label"}
	for name, body := range map[string]string{
		"patch-strips-owner":  `{"metadata":{"ownerReferences":null}}`,
		"patch-strips-labels": fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, sandboxv1beta1.SandboxTemplateRefHashLabel),
	} {
		t.Run(name, func(t *testing.T) {
			switch err := patch(body); {
			case err == nil:
				t.Errorf("the API server admitted the executor's patch %s", body)
			case !slices.ContainsFunc(refusals, func(m string) bool { return strings.Contains(err.Error(), m) }):
				t.Errorf("refused, but not by an annotations-only or cold-start rule: %v", err)
			default:
				t.Logf("refused as expected: %v", err)
			}
		})
	}
}
