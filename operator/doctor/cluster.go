package doctor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// The cluster's own checks: the API server, the CRDs, RBAC, RuntimeClasses, the cold-start
// admission policy and the kubelets' PID limit.

func (c *Checker) checkAPI() Result {
	version, err := c.Clients.ServerVersion()
	if err != nil {
		return Result{Fail, "kubernetes API", oneLine(err), "check the kubeconfig (" + c.kubeconfigName() + ") and that the API server is reachable from here"}
	}
	return Result{OK, "kubernetes API", "server " + version, ""}
}

func (c *Checker) kubeconfigName() string {
	if c.Config.Kubeconfig == "" {
		return "in-cluster ServiceAccount, else $KUBECONFIG"
	}
	return c.Config.Kubeconfig
}

// checkCRDs asks discovery (open to every authenticated identity) which versions serve each CRD.
func (c *Checker) checkCRDs() []Result {
	served, err := c.Clients.ServedVersions(kube.CRDs)
	var discErr *kube.DiscoveryError
	switch {
	case errors.As(err, &discErr) && discErr.GroupVersion != "":
		return []Result{{Fail, "crds", "API discovery of " + discErr.GroupVersion + " failed: " + oneLine(err), "check the agent-sandbox conversion webhook and the API server"}}
	case err != nil:
		return []Result{{Fail, "crds", "API discovery failed: " + oneLine(err), "check the API server and its aggregated APIs"}}
	}
	var out []Result
	for _, gr := range kube.CRDs {
		check := "crd " + gr.String()
		versions := served[gr]
		switch {
		case len(versions) == 0:
			out = append(out, Result{Fail, check, "not served by the API server", "install agent-sandbox v0.5.x with its extensions CRDs and run its controller with --extensions"})
		case !slices.Contains(versions, kube.APIVersion):
			out = append(out, Result{Fail, check, "served as " + strings.Join(versions, ", ") + "; sandbox-executor needs " + kube.APIVersion, "upgrade agent-sandbox to v0.5.x"})
		default:
			out = append(out, Result{OK, check, "served versions " + strings.Join(versions, ", "), ""})
		}
	}
	return out
}

// checkRBAC asks the API server, verb by verb, whether this identity may make each call the
// executor makes.
func (c *Checker) checkRBAC(ctx context.Context) []Result {
	ns := c.Config.Namespace
	var out []Result
	type permission struct {
		kube.Permission
		fix string
	}
	var perms []permission
	for _, p := range kube.RequiredPermissions {
		perms = append(perms, permission{p, "bind the executor's identity to the chart's Role (helm upgrade; RoleBinding <release>-sandbox-executor grants exactly these)"})
	}
	if c.Config.UnknownImage == config.UnknownImageCold {
		for _, p := range kube.ColdStartPermissions {
			perms = append(perms, permission{p, "helm upgrade with coldStart.enabled=true (unknown_image = \"cold\")"})
		}
	}
	for _, p := range perms {
		check := "rbac " + p.String()
		allowed, reason, err := c.Clients.MayI(ctx, ns, p.Permission)
		switch {
		case err != nil:
			out = append(out, Result{Fail, check, "cannot ask the API server: " + oneLine(err), "check the API server"})
		case !allowed:
			detail := "denied in namespace " + ns + " (needed by " + p.Why + ")"
			if reason != "" {
				detail += ": " + reason
			}
			out = append(out, Result{Fail, check, detail, p.fix})
		default:
			out = append(out, Result{OK, check, "allowed in namespace " + ns, ""})
		}
	}
	return out
}

func (c *Checker) checkRuntimeClasses(ctx context.Context) []Result {
	var out []Result
	for _, name := range c.Config.RuntimeClasses {
		check := "runtimeclass " + name
		rc, err := c.Clients.RuntimeClass(ctx, name)
		switch {
		case apierrors.IsForbidden(err):
			out = append(out, Result{Warn, check, "cannot verify: this identity may not get runtimeclasses", "bind the executor's identity to the chart's ClusterRole ...-doctor (helm upgrade)"})
		case apierrors.IsNotFound(err):
			out = append(out, Result{Fail, check, "not found: every job pod would be refused (runtime_classes in " + c.Config.Path() + ")",
				"install gVisor (runsc) on the nodes and create the RuntimeClass (the chart's runtimeClass.create), or fix runtime_classes"})
		case err != nil:
			out = append(out, Result{Fail, check, oneLine(err), "check the API server"})
		default:
			if rc.Scheduling != nil {
				c.tolerations = append(c.tolerations, rc.Scheduling.Tolerations...)
			}
			out = append(out, Result{OK, check, "handler " + rc.Handler, ""})
		}
	}
	return out
}

// checkColdStartPolicy looks for what holds cold starts to gVisor: RBAC lets the executor create
// Sandboxes of any pod spec, so a ValidatingAdmissionPolicy must match this identity, require a
// configured RuntimeClass, and be bound with Deny in the namespace.
func (c *Checker) checkColdStartPolicy(ctx context.Context) Result {
	const check = "admission policy (unknown_image = cold)"
	const fix = "helm upgrade with coldStart.enabled=true (its policy matches the release's ServiceAccount and namespace), or set unknown_image = \"reject\""
	user, err := c.Clients.WhoAmI(ctx)
	if err != nil {
		return Result{Warn, check, "cannot verify: who this identity is is unknown: " + oneLine(err), "check the API server (SelfSubjectReview)"}
	}
	policies, bindings, err := c.Clients.AdmissionPolicies(ctx)
	switch {
	case apierrors.IsForbidden(err):
		return Result{Warn, check, "cannot verify: this identity may not list validatingadmissionpolicies and their bindings", "bind the executor's identity to the chart's ClusterRole ...-doctor (helm upgrade)"}
	case err != nil:
		return Result{Fail, check, oneLine(err), "check the API server"}
	}
	var unbound []string
	for _, p := range policies {
		if !holdsToRuntime(&p, user, c.Config.RuntimeClasses) {
			continue
		}
		for _, b := range bindings {
			if b.Spec.PolicyName == p.Name && slices.Contains(b.Spec.ValidationActions, admissionv1.Deny) && bindsNamespace(&b, c.Config.Namespace) {
				return Result{OK, check, fmt.Sprintf("policy %s (binding %s, Deny) holds the Sandboxes %s creates to %s", p.Name, b.Name, user, strings.Join(c.Config.RuntimeClasses, ", ")), ""}
			}
		}
		unbound = append(unbound, p.Name)
	}
	if len(unbound) > 0 {
		return Result{Fail, check, fmt.Sprintf("policy %s is not bound with validationActions Deny in namespace %s: cold starts are not held to gVisor", strings.Join(unbound, ", "), c.Config.Namespace), fix}
	}
	return Result{Fail, check, fmt.Sprintf("no ValidatingAdmissionPolicy holds the Sandboxes %s creates to %s: a stolen executor token could start pods outside the sandbox", user, strings.Join(c.Config.RuntimeClasses, ", ")), fix}
}

// holdsToRuntime: the policy matches requests by user and validates runtimeClassName against one
// of the configured RuntimeClasses.
func holdsToRuntime(p *admissionv1.ValidatingAdmissionPolicy, user string, runtimeClasses []string) bool {
	matchesUser := slices.ContainsFunc(p.Spec.MatchConditions, func(m admissionv1.MatchCondition) bool {
		return strings.Contains(m.Expression, "'"+user+"'")
	})
	checksRuntime := slices.ContainsFunc(p.Spec.Validations, func(v admissionv1.Validation) bool {
		return strings.Contains(v.Expression, "runtimeClassName") && slices.ContainsFunc(runtimeClasses, func(rc string) bool { return strings.Contains(v.Expression, "'"+rc+"'") })
	})
	return matchesUser && checksRuntime
}

func bindsNamespace(b *admissionv1.ValidatingAdmissionPolicyBinding, namespace string) bool {
	if b.Spec.MatchResources == nil || b.Spec.MatchResources.NamespaceSelector == nil {
		return true
	}
	selector, err := metav1.LabelSelectorAsSelector(b.Spec.MatchResources.NamespaceSelector)
	return err == nil && selector.Matches(labels.Set{corev1.LabelMetadataName: namespace})
}

// checkKubelets reads podPidsLimit from every node's kubelet: Kubernetes has no per-pod PID
// field, so the kubelet's limit is what stops a fork bomb in a job from exhausting the node.
func (c *Checker) checkKubelets(ctx context.Context) []Result {
	const fix = "run doctor --kubelet with cluster-admin credentials (list nodes, get nodes/proxy)"
	nodes, err := c.Clients.Nodes(ctx)
	if err != nil {
		return []Result{{Fail, "pids limit", "cannot list nodes: " + oneLine(err), fix}}
	}
	configz := c.KubeletConfigz
	if configz == nil {
		configz = c.Clients.KubeletConfigz
	}
	var out []Result
	skipped := 0
	for _, n := range nodes {
		if !c.runsJobs(&n) {
			skipped++
			continue
		}
		check := "pids limit node " + n.Name
		data, err := configz(ctx, n.Name)
		if err != nil {
			out = append(out, Result{Fail, check, "cannot read the kubelet's configz: " + oneLine(err), fix})
			continue
		}
		var z struct {
			KubeletConfig struct {
				PodPidsLimit *int64 `json:"podPidsLimit"`
			} `json:"kubeletconfig"`
		}
		if err := json.Unmarshal(data, &z); err != nil {
			out = append(out, Result{Fail, check, "unreadable kubelet configz: " + oneLine(err), fix})
			continue
		}
		limit := z.KubeletConfig.PodPidsLimit
		if limit == nil || *limit <= 0 {
			out = append(out, Result{Warn, check, "podPidsLimit unset: a fork bomb in a job can exhaust the node's PIDs", "set podPidsLimit (e.g. 4096) in the kubelet configuration"})
			continue
		}
		out = append(out, Result{OK, check, fmt.Sprintf("podPidsLimit %d", *limit), ""})
	}
	if skipped > 0 {
		out = append(out, Result{OK, "pids limit", fmt.Sprintf("%d nodes not checked: job pods do not tolerate their taints", skipped), ""})
	}
	return out
}

// runsJobs reports whether job pods may be scheduled on the node as far as taints go.
func (c *Checker) runsJobs(n *corev1.Node) bool {
	for i := range n.Spec.Taints {
		taint := &n.Spec.Taints[i]
		if taint.Effect == corev1.TaintEffectPreferNoSchedule {
			continue
		}
		if !slices.ContainsFunc(c.tolerations, func(t corev1.Toleration) bool { return t.ToleratesTaint(logr.Discard(), taint, false) }) {
			return false
		}
	}
	return true
}
