//go:build security

package security

import (
	"context"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"

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
func TestColdSandboxPolicyRefusesWidenedPods(t *testing.T) {
	t.Parallel()
	c := clusterjobs.Connect(t)
	r := c.NewRunner(t, "sec-coldpolicy", `unknown_image = "cold"
cold_template = "`+localcluster.Template+`"
cold_images = ["`+localcluster.PosixImage+`"]`,
		clusterjobs.Pool{Name: localcluster.Pool, Images: []string{localcluster.CIImage}})
	ctx := context.Background()

	rc := clusterjobs.RESTConfig(t, c.ExecutorKubeconfig())
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	review, err := kube.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
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
	create := func(t *testing.T, name string, widen func(*testing.T, *corev1.PodSpec)) error {
		sbx := &sandboxv1beta1.Sandbox{
			ObjectMeta: metav1.ObjectMeta{Name: j.ClaimName() + "-" + name, Namespace: own.Namespace,
				Labels: own.Labels, Annotations: own.Annotations, OwnerReferences: own.OwnerReferences},
			Spec: *own.Spec.DeepCopy(),
		}
		widen(t, &sbx.Spec.PodTemplate.Spec)
		_, err := sandboxes.Create(ctx, sbx, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	if err := create(t, "unchanged", func(*testing.T, *corev1.PodSpec) {}); err != nil {
		t.Fatalf("positive control: a copy of the executor's own cold Sandbox was refused: %v", err)
	}

	job := func(spec *corev1.PodSpec) *corev1.Container { return &spec.Containers[0] }
	for _, tc := range []struct {
		name, message string
		widen         func(*testing.T, *corev1.PodSpec)
	}{
		{"hostpath", "may have emptyDir volumes only", func(t *testing.T, spec *corev1.PodSpec) {
			spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}})
			job(spec).VolumeMounts = append(job(spec).VolumeMounts, corev1.VolumeMount{Name: "host", MountPath: "/host"})
		}},
		{"secret", "may have emptyDir volumes only", func(t *testing.T, spec *corev1.PodSpec) {
			spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "secret", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "sandbox-executor-egress-admin"}}})
			job(spec).VolumeMounts = append(job(spec).VolumeMounts, corev1.VolumeMount{Name: "secret", MountPath: "/secret"})
		}},
		{"privileged", "may not be privileged", func(t *testing.T, spec *corev1.PodSpec) {
			privileged := true
			job(spec).SecurityContext.Privileged = &privileged
		}},
		{"net-admin", "must drop ALL capabilities and add none but", func(t *testing.T, spec *corev1.PodSpec) {
			caps := job(spec).SecurityContext.Capabilities
			caps.Add = append(caps.Add, "NET_ADMIN")
		}},
		{"no-netfence", "must keep the cold template's netfence init container", func(t *testing.T, spec *corev1.PodSpec) {
			before := len(spec.InitContainers)
			spec.InitContainers = slices.DeleteFunc(spec.InitContainers, func(c corev1.Container) bool { return c.Name == "netfence" })
			if len(spec.InitContainers) == before {
				t.Fatal("the executor's cold Sandbox has no netfence init container to remove: its template predates the netstack fence")
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := create(t, tc.name, tc.widen)
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
}
