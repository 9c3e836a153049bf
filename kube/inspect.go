package kube

import (
	"context"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
)

// The reads doctor makes to check a cluster before use. Errors are the API's own: doctor words
// each check's outcome itself.

// ServerVersion is the API server's version, the first sign that it answers.
func (c *Clients) ServerVersion() (string, error) {
	v, err := c.Kube.Discovery().ServerVersion()
	if err != nil {
		return "", err
	}
	return v.GitVersion, nil
}

// DiscoveryError is a failed API discovery; GroupVersion names the group version whose
// resources could not be listed, or is empty when the groups themselves could not be.
type DiscoveryError struct {
	GroupVersion string
	Err          error
}

func (e *DiscoveryError) Error() string { return e.Err.Error() }
func (e *DiscoveryError) Unwrap() error { return e.Err }

// ServedVersions asks discovery (open to every authenticated identity) which versions serve
// each of resources.
func (c *Clients) ServedVersions(resources []schema.GroupResource) (map[schema.GroupResource][]string, error) {
	disc := c.Kube.Discovery()
	groups, err := disc.ServerGroups()
	if err != nil {
		return nil, &DiscoveryError{Err: err}
	}
	served := map[schema.GroupResource][]string{}
	for _, g := range groups.Groups {
		if !slices.ContainsFunc(resources, func(gr schema.GroupResource) bool { return gr.Group == g.Name }) {
			continue
		}
		for _, v := range g.Versions {
			list, err := disc.ServerResourcesForGroupVersion(v.GroupVersion)
			if err != nil {
				return nil, &DiscoveryError{GroupVersion: v.GroupVersion, Err: err}
			}
			for _, r := range list.APIResources {
				gr := schema.GroupResource{Group: g.Name, Resource: r.Name}
				served[gr] = append(served[gr], v.Version)
			}
		}
	}
	return served, nil
}

// MayI asks the API server whether this identity may make the call p in namespace, and if not,
// its reason.
func (c *Clients) MayI(ctx context.Context, namespace string, p Permission) (allowed bool, reason string, err error) {
	resource, sub, _ := strings.Cut(p.Resource, "/")
	review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: namespace, Verb: p.Verb, Group: p.Group, Resource: resource, Subresource: sub},
	}}
	got, err := c.Kube.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
	if err != nil {
		return false, "", err
	}
	return got.Status.Allowed, got.Status.Reason, nil
}

// RuntimeClass reads a RuntimeClass (cluster-scoped).
func (c *Clients) RuntimeClass(ctx context.Context, name string) (*nodev1.RuntimeClass, error) {
	return c.Kube.NodeV1().RuntimeClasses().Get(ctx, name, metav1.GetOptions{})
}

// WarmPool reads a SandboxWarmPool.
func (c *Clients) WarmPool(ctx context.Context, namespace, name string) (*extv1beta1.SandboxWarmPool, error) {
	return c.Extensions.ExtensionsV1beta1().SandboxWarmPools(namespace).Get(ctx, name, metav1.GetOptions{})
}

// Template reads a SandboxTemplate.
func (c *Clients) Template(ctx context.Context, namespace, name string) (*extv1beta1.SandboxTemplate, error) {
	return c.Extensions.ExtensionsV1beta1().SandboxTemplates(namespace).Get(ctx, name, metav1.GetOptions{})
}

// NetworkPolicies lists the NetworkPolicies of a namespace.
func (c *Clients) NetworkPolicies(ctx context.Context, namespace string) ([]networkingv1.NetworkPolicy, error) {
	list, err := c.Kube.NetworkingV1().NetworkPolicies(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// Pods lists the pods of a namespace that selector (a label selector's string form) selects.
func (c *Clients) Pods(ctx context.Context, namespace, selector string) ([]corev1.Pod, error) {
	list, err := c.Kube.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// AdmissionPolicies lists the cluster's ValidatingAdmissionPolicies and their bindings.
func (c *Clients) AdmissionPolicies(ctx context.Context) ([]admissionv1.ValidatingAdmissionPolicy, []admissionv1.ValidatingAdmissionPolicyBinding, error) {
	policies, err := c.Kube.AdmissionregistrationV1().ValidatingAdmissionPolicies().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, err
	}
	bindings, err := c.Kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, err
	}
	return policies.Items, bindings.Items, nil
}

// WhoAmI is the username the API server knows this identity by.
func (c *Clients) WhoAmI(ctx context.Context) (string, error) {
	review, err := c.Kube.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return review.Status.UserInfo.Username, nil
}

// Nodes lists the cluster's nodes (cluster-admin credentials).
func (c *Clients) Nodes(ctx context.Context) ([]corev1.Node, error) {
	nodes, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	return nodes.Items, nil
}

// KubeletConfigz is a node's kubelet /configz, through the API server's node proxy.
func (c *Clients) KubeletConfigz(ctx context.Context, node string) ([]byte, error) {
	return c.Kube.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", node, "proxy", "configz").DoRaw(ctx)
}
