package kube

import (
	"context"
	"fmt"
	"hash/fnv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/failure"
)

// permanentSandboxReasons are Ready=False reasons of a Sandbox that waiting cannot fix: its pod
// ended, or the Sandbox expired.
var permanentSandboxReasons = []string{
	sandboxv1beta1.SandboxReasonPodFailed, sandboxv1beta1.SandboxReasonPodSucceeded, sandboxv1beta1.SandboxReasonExpired,
}

// ColdStart runs a job whose image no warm pool serves (unknown_image = "cold"): it creates a
// Sandbox from the SandboxTemplate template with the job's image in its first container, named
// like the job's claim (a retried prepare adopts it), waits until it is Ready and verifies its
// pod as Resolve does. req.Pool is not used. The Sandbox carries the image, the job's labels and
// its lifecycle: nothing of the job's variables.
func (c *Claimer) ColdStart(ctx context.Context, req ClaimRequest, template string) (*Sandbox, error) {
	if req.Name == "" {
		return nil, failure.SystemError(nil, "no Sandbox name for job %d: the request must name it (kube.ClaimName)", req.Job.ID)
	}
	tmpl, err := c.clients.Extensions.ExtensionsV1beta1().SandboxTemplates(req.Namespace).Get(ctx, template, metav1.GetOptions{})
	if isObjectNotFound(err) {
		return nil, failure.PermanentError(nil, "SandboxTemplate %q not found in namespace %q: create it or fix cold_template in the executor config", template, req.Namespace)
	}
	if err != nil {
		return nil, explainAPIError(err, apiCall{"get", SandboxTemplates.String(), req.Namespace, template})
	}
	want, err := coldSandbox(tmpl, req.Name, req, c.shutdownTime(req))
	if err != nil {
		return nil, err
	}
	sandboxes := c.clients.Sandboxes.AgentsV1beta1().Sandboxes(req.Namespace)
	sbx, err := createOrAdopt(ctx, sandboxes, want, "Sandbox", Sandboxes.String())
	if err != nil {
		return nil, err
	}
	ready, err := waitReady(ctx, readyWatch[*sandboxv1beta1.Sandbox]{
		kind:     "Sandbox",
		resource: Sandboxes.String(),
		origin:   "cold start from template " + template,
		client:   sandboxes,
		state:    sandboxState,
	}, sbx, req.ReadyTimeout)
	if err != nil {
		return nil, err
	}
	return c.resolveColdStart(ctx, ready, req.RuntimeClasses)
}

func sandboxState(sbx *sandboxv1beta1.Sandbox) (ready, hopeless bool, why string) {
	return readyState(sbx.Status.Conditions, permanentSandboxReasons)
}

// resolveColdStart finds the pod of a Ready cold-started Sandbox and fails closed unless it runs
// an allowed RuntimeClass and is that Sandbox's own.
func (c *Claimer) resolveColdStart(ctx context.Context, sbx *sandboxv1beta1.Sandbox, runtimeClasses []string) (*Sandbox, error) {
	template := sbx.Annotations[sandboxv1beta1.SandboxTemplateRefAnnotation]
	out, err := c.verifiedSandbox(ctx, sbx, nil, podOwner{coldStart: true, sandboxUID: sbx.UID, template: "SandboxTemplate " + template + " (cold_template)"}, runtimeClasses)
	if err != nil {
		return nil, err
	}
	out.ColdTemplate = template
	out.Launch = LaunchCold
	return out, nil
}

// coldSandbox is the Sandbox agent-sandbox would make from the template for a claim, with the
// job's image: the template's blueprint, its secure defaults, and the template's ref-hash label,
// which its managed NetworkPolicy selects pods by. The sandbox controller copies that label onto
// the pod only from a Sandbox controlled by an extensions object, hence the controller reference
// to the template (it also deletes the Sandbox with its template).
func coldSandbox(tmpl *extv1beta1.SandboxTemplate, name string, req ClaimRequest, shutdown metav1.Time) (*sandboxv1beta1.Sandbox, error) {
	blueprint := tmpl.Spec.SandboxBlueprint.DeepCopy()
	podTemplate := &blueprint.PodTemplate
	if len(podTemplate.Spec.Containers) == 0 {
		return nil, failure.PermanentError(nil, "SandboxTemplate %s/%s has no containers: fix it or cold_template in the executor config", tmpl.Namespace, tmpl.Name)
	}
	podTemplate.Spec.Containers[0].Image = req.Job.Image
	applySecureDefaults(tmpl, &podTemplate.Spec)
	hash := TemplateRefHash(tmpl.Name)
	if podTemplate.ObjectMeta.Labels == nil {
		podTemplate.ObjectMeta.Labels = map[string]string{}
	}
	podTemplate.ObjectMeta.Labels[sandboxv1beta1.SandboxTemplateRefHashLabel] = hash
	labels := jobLabels(req.Job, req.Runner)
	labels[sandboxv1beta1.SandboxTemplateRefHashLabel] = hash
	labels[sandboxv1beta1.SandboxLaunchTypeLabel] = sandboxv1beta1.SandboxLaunchTypeCold
	isController := true
	policy := sandboxv1beta1.ShutdownPolicyDelete
	return &sandboxv1beta1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Namespace:   req.Namespace,
			Labels:      labels,
			Annotations: coldAnnotations(tmpl.Name, req.Binding),
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: extv1beta1.GroupVersion.String(), Kind: extv1beta1.SandboxTemplateKind,
				Name: tmpl.Name, UID: tmpl.UID, Controller: &isController,
			}},
		},
		Spec: sandboxv1beta1.SandboxSpec{
			SandboxBlueprint: *blueprint,
			// Delete, as for claims: a runner that dies never runs cleanup.
			Lifecycle: sandboxv1beta1.Lifecycle{ShutdownTime: &shutdown, ShutdownPolicy: &policy},
		},
	}, nil
}

// coldAnnotations are a cold-started Sandbox's: its template, and the job's binding.
func coldAnnotations(template, binding string) map[string]string {
	annotations := bindingAnnotation(binding)
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[sandboxv1beta1.SandboxTemplateRefAnnotation] = template
	return annotations
}

// applySecureDefaults is what agent-sandbox applies to every pod spec it takes from a template
// (ApplySandboxSecureDefaults in its extensions/controllers, not imported: it pulls in
// controller-runtime): no ServiceAccount token unless asked for, and public resolvers instead of
// cluster DNS under its default NetworkPolicy.
func applySecureDefaults(tmpl *extv1beta1.SandboxTemplate, spec *corev1.PodSpec) {
	if spec.AutomountServiceAccountToken == nil {
		automount := false
		spec.AutomountServiceAccountToken = &automount
	}
	management := tmpl.Spec.NetworkPolicyManagement
	managed := management == "" || management == extv1beta1.NetworkPolicyManagementManaged
	if managed && tmpl.Spec.NetworkPolicy == nil && spec.DNSPolicy == "" {
		spec.DNSPolicy = corev1.DNSNone
		spec.DNSConfig = &corev1.PodDNSConfig{Nameservers: []string{"8.8.8.8", "1.1.1.1"}}
	}
}

// TemplateRefHash is agent-sandbox's SandboxTemplateRefHash: the FNV-1a hash of the template's
// name in 8 hex digits, the value of sandboxv1beta1.SandboxTemplateRefHashLabel.
func TemplateRefHash(template string) string {
	h := fnv.New32a()
	h.Write([]byte(template))
	return fmt.Sprintf("%08x", h.Sum32())
}

// isColdStart tells a Sandbox this executor cold-started (controlled by its template, labelled by
// us) from one agent-sandbox made for a claim or a pool.
func isColdStart(sbx *sandboxv1beta1.Sandbox) bool {
	ref := metav1.GetControllerOf(sbx)
	return ref != nil && ref.Kind == extv1beta1.SandboxTemplateKind && sbx.Labels[LabelManagedBy] == ManagedByValue
}

// findColdStart returns the job's cold-started Sandbox named name, bound to binding and verified,
// or nil if there is none.
func (c *Claimer) findColdStart(ctx context.Context, namespace, name, binding string, runtimeClasses []string) (*Sandbox, error) {
	sbx, err := c.clients.Sandboxes.AgentsV1beta1().Sandboxes(namespace).Get(ctx, name, metav1.GetOptions{})
	if isObjectNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, explainAPIError(err, apiCall{"get", Sandboxes.String(), namespace, name})
	}
	if !isColdStart(sbx) {
		return nil, nil // a released claim's Sandbox of the same name, on its way out
	}
	if !boundTo(sbx, binding) {
		return nil, otherJobError("Sandbox", namespace, name)
	}
	if ready, _, why := sandboxState(sbx); !ready {
		return nil, failure.SystemError(nil, "Sandbox %s/%s is not Ready: %s", namespace, name, why)
	}
	return c.resolveColdStart(ctx, sbx, runtimeClasses)
}

// ReleaseColdStart deletes the job's cold-started Sandbox, if it is bound to binding (AnyJob:
// whoever's it is); its pod goes with it. A Sandbox already gone is success, and so is a Sandbox
// of that name that is no cold start (a claim's, which goes with its claim); another job's is
// left alone (ErrOtherJob).
func (c *Claimer) ReleaseColdStart(ctx context.Context, namespace, name, binding string, outcome Outcome) error {
	notColdStart := func(sbx *sandboxv1beta1.Sandbox) bool { return !isColdStart(sbx) }
	return releaseBound(ctx, c.clients.Sandboxes.AgentsV1beta1().Sandboxes(namespace), namespace, name, binding, "Sandbox", Sandboxes.String(), notColdStart, outcome)
}
