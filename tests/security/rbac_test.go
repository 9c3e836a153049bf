//go:build security

package security

import (
	"context"
	"slices"
	"strings"
	"testing"

	authv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	sbxkube "github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
)

type access struct {
	verb, group, resource, subresource, namespace string
}

func (a access) String() string {
	s := a.verb + " " + a.resource
	if a.group != "" {
		s += "." + a.group
	}
	if a.subresource != "" {
		s += "/" + a.subresource
	}
	if a.namespace != "" {
		s += " in " + a.namespace
	} else {
		s += " cluster-wide"
	}
	return s
}

const (
	extGroup     = "extensions.agents.x-k8s.io"
	sandboxGroup = "agents.x-k8s.io"
	rbacGroup    = "rbac.authorization.k8s.io"
)

// TestExecutorCanDoOnlyItsJob: the executor's ServiceAccount (executor.kubeconfig) may do what a
// job needs in its namespace (claims; get pools, templates, sandboxes and pods; pods/exec; with
// deploy/local's cold-images component, create and delete sandboxes) and
// nothing that would widen a job's reach or read the cluster's secrets; a real attempt to list
// secrets or create a pod is refused with 403.
func TestExecutorCanDoOnlyItsJob(t *testing.T) {
	t.Parallel()
	c := clusterjobs.Connect(t)
	kube, err := kubernetes.NewForConfig(clusterjobs.RESTConfig(t, c.ExecutorKubeconfig()))
	if err != nil {
		t.Fatal(err)
	}
	ns := clusterjobs.Namespace
	// What the executor needs is kube.RequiredPermissions, which the chart (deploy/chart) grants,
	// and kube.ColdStartPermissions, which deploy/local/values.yaml adds (coldStart.enabled).
	var allowed []access
	for _, p := range slices.Concat(sbxkube.RequiredPermissions, sbxkube.ColdStartPermissions) {
		resource, sub, _ := strings.Cut(p.Resource, "/")
		allowed = append(allowed, access{p.Verb, p.Group, resource, sub, ns})
	}

	denied := []access{
		// Pods: no new pods, no changing or deleting jobs' pods, no other way into them.
		{"create", "", "pods", "attach", ns}, {"create", "", "pods", "", ns}, {"delete", "", "pods", "", ns}, {"update", "", "pods", "", ns}, {"patch", "", "pods", "", ns},
		{"create", "", "pods", "portforward", ns}, {"update", "", "pods", "ephemeralcontainers", ns},
		{"patch", "", "pods", "ephemeralcontainers", ns},
		// Exec anywhere else.
		{"create", "", "pods", "exec", "kube-system"}, {"create", "", "pods", "exec", "default"}, {"create", "", "pods", "exec", ""},
		{"get", "", "pods", "", "kube-system"},
		// Secrets and credentials.
		{"get", "", "secrets", "", ns}, {"list", "", "secrets", "", ns}, {"watch", "", "secrets", "", ns}, {"list", "", "secrets", "", ""},
		{"get", "", "secrets", "", "kube-system"}, {"create", "", "serviceaccounts", "token", ns}, {"get", "", "configmaps", "", ns},
		{"create", "", "serviceaccounts", "", ns},
		// The sandbox machinery: no changing sandboxes, templates, pools or claims (a template
		// decides the runtime and the network policy). Creating sandboxes (cold-images) is
		// allowed, and held to gVisor by the component's admission policy (TestColdImageAdmissionPolicy).
		// Patching claims and sandboxes is allowed (cleanup records the job's outcome), and held
		// to annotations by admission (TestExecutorPatchesOnlyAnnotations).
		{"update", sandboxGroup, "sandboxes", "", ns}, {"create", sandboxGroup, "sandboxes", "", "default"},
		{"create", extGroup, "sandboxtemplates", "", ns}, {"update", extGroup, "sandboxtemplates", "", ns}, {"patch", extGroup, "sandboxtemplates", "", ns},
		{"delete", extGroup, "sandboxtemplates", "", ns},
		{"create", extGroup, "sandboxwarmpools", "", ns}, {"update", extGroup, "sandboxwarmpools", "", ns}, {"patch", extGroup, "sandboxwarmpools", "", ns},
		{"update", extGroup, "sandboxclaims", "", ns}, {"patch", extGroup, "sandboxclaims", "", "default"},
		{"create", extGroup, "sandboxclaims", "", "default"},
		// Network policy (it is the job's egress fence) and the runtime.
		{"create", "networking.k8s.io", "networkpolicies", "", ns}, {"update", "networking.k8s.io", "networkpolicies", "", ns},
		{"delete", "networking.k8s.io", "networkpolicies", "", ns},
		{"create", "node.k8s.io", "runtimeclasses", "", ""}, {"update", "node.k8s.io", "runtimeclasses", "", ""},
		// Nodes and RBAC.
		{"get", "", "nodes", "", ""}, {"list", "", "nodes", "", ""}, {"get", "", "nodes", "proxy", ""}, {"create", "", "nodes", "proxy", ""},
		{"create", rbacGroup, "clusterroles", "", ""}, {"bind", rbacGroup, "clusterroles", "", ""}, {"escalate", rbacGroup, "clusterroles", "", ""},
		{"create", rbacGroup, "clusterrolebindings", "", ""}, {"create", rbacGroup, "rolebindings", "", ns}, {"update", rbacGroup, "roles", "", ns},
		{"escalate", rbacGroup, "roles", "", ns}, {"bind", rbacGroup, "roles", "", ns},
		{"impersonate", "", "serviceaccounts", "", ns}, {"impersonate", "", "users", "", ""},
		{"create", "", "namespaces", "", ""}, {"list", "", "namespaces", "", ""}, {"update", "", "namespaces", "", ""},
		{"create", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", ""},
		{"create", "apps", "deployments", "", ns}, {"create", "batch", "jobs", "", ns}, {"create", "apps", "daemonsets", "", "kube-system"},
		{"*", "*", "*", "", ns}, {"*", "*", "*", "", ""},
	}

	ctx := context.Background()
	review := func(a access) bool {
		t.Helper()
		r, err := kube.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authv1.SelfSubjectAccessReview{Spec: authv1.SelfSubjectAccessReviewSpec{
			ResourceAttributes: &authv1.ResourceAttributes{Namespace: a.namespace, Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.subresource},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("SelfSubjectAccessReview %s: %v", a, err)
		}
		return r.Status.Allowed
	}
	for _, a := range allowed {
		if !review(a) {
			t.Errorf("the executor may not %s: it needs to", a)
		}
	}
	for _, a := range denied {
		if review(a) {
			t.Errorf("the executor MAY %s", a)
		}
	}
	t.Logf("%d needed permissions allowed, %d dangerous ones denied", len(allowed), len(denied))

	// Real attempts, not just reviews.
	if _, err := kube.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("listing secrets as the executor: %v, want 403 Forbidden", err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "sec-rbac-", Labels: map[string]string{suiteLabel: "true"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Image: "sandbox-executor.local/ci:bookworm"}}},
	}
	created, err := kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if !apierrors.IsForbidden(err) {
		t.Errorf("creating a pod as the executor (dry run): %v, want 403 Forbidden", err)
		if created != nil && created.Name != "" {
			c.Admin.Kube.CoreV1().Pods(ns).Delete(ctx, created.Name, metav1.DeleteOptions{})
		}
	}
	// The positive control: the same client does get what it is allowed to.
	if _, err := kube.CoreV1().Pods(ns).Get(ctx, "no-such-pod", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("getting a pod as the executor: %v, want 404 (allowed, not there)", err)
	}
}
