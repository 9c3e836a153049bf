// Package doctor implements the doctor command: it checks a cluster before sandbox-executor uses
// it, with the executor's own credentials, and prints one line per check:
//
//	ok|warn|FAIL  <check>: <detail>[; fix: <what to do>]
//
// A FAIL means jobs will fail; a warn means they run but less safely or more slowly than they
// should. doctor fails (exit 1) when any check FAILs.
package doctor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/urfave/cli/v2"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/stages"
	"github.com/sandbox-executor/sandbox-executor/stageserver"
)

// Status is a check's outcome.
type Status string

const (
	OK   Status = "ok"
	Warn Status = "warn"
	Fail Status = "FAIL"
)

// Result is one check's line.
type Result struct {
	Status Status
	Check  string
	Detail string
	Fix    string
}

func (r Result) String() string {
	s := fmt.Sprintf("%-4s  %s: %s", r.Status, r.Check, r.Detail)
	if r.Fix != "" {
		s += "; fix: " + r.Fix
	}
	return s
}

// Command is the doctor verb and its flags.
func Command(setup stages.Setup) *cli.Command {
	return &cli.Command{
		Name:  "doctor",
		Usage: "check the cluster before use: CRDs, RBAC, RuntimeClasses, pools, their templates and NetworkPolicies, the cold-start admission policy, egress proxies (exit 1 on any FAIL; 2, as every verb, when the API server cannot be reached)",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "kubelet", Usage: "also read every node's kubelet podPidsLimit (needs cluster-admin credentials)"},
		},
		Action: setup(func(c *cli.Context, env *stages.Env) error {
			return Run(c.Context, env, Options{Kubelet: c.Bool("kubelet")})
		}),
	}
}

// Options select optional checks.
type Options struct {
	// Kubelet reads every node's kubelet configuration (podPidsLimit). It needs list nodes and
	// get nodes/proxy, which the executor is never granted: run it with cluster-admin credentials.
	Kubelet bool
}

// Checker runs the checks against one cluster.
type Checker struct {
	Config  *config.Config
	Clients *kube.Clients
	Options Options
	// KubeletConfigz returns a node's /configz through the API server's node proxy; tests
	// replace it.
	KubeletConfigz func(ctx context.Context, node string) ([]byte, error)

	// HTTP reaches the egress proxies' admin ports; tests replace it.
	HTTP *http.Client
	// Version is this build, which the stage server should run too.
	Version string

	// tolerations of the job pods (templates and RuntimeClasses seen so far): the kubelet check
	// skips nodes whose taints keep job pods off.
	tolerations []corev1.Toleration
	// templates found by the pool checks, for the NetworkPolicy check.
	templates []*extv1beta1.SandboxTemplate
}

// Run prints every check's line and fails when any check FAILs.
func Run(ctx context.Context, env *stages.Env, opts Options) error {
	clients, err := env.Clients()
	if err != nil {
		fmt.Fprintln(env.Stdout, Result{Fail, "kubernetes client", err.Error(), "set kubeconfig/context in " + env.Config.Path() + ", or run in the cluster with a ServiceAccount token"})
		return err
	}
	failed := 0
	results := (&Checker{Config: env.Config, Clients: clients, Options: opts, Version: env.Version}).Run(ctx)
	for _, r := range results {
		fmt.Fprintln(env.Stdout, r)
		if r.Status == Fail {
			failed++
		}
	}
	if api := results[0]; api.Status == Fail {
		// An API server that does not answer is a system failure, the same exit code as in gc or
		// a stage: nothing about the cluster was checked.
		return failure.SystemError(nil, "doctor: %s: %s", api.Check, api.Detail)
	}
	if failed > 0 {
		return failure.PermanentError(nil, "doctor: %d of %d checks failed", failed, len(results))
	}
	return nil
}

// Run runs the checks in order. Nothing else is worth asking an API server that does not answer.
func (c *Checker) Run(ctx context.Context) []Result {
	c.tolerations, c.templates = nil, nil
	api := c.checkAPI()
	if api.Status == Fail {
		return []Result{api}
	}
	out := []Result{api}
	out = append(out, c.checkCRDs()...)
	out = append(out, c.checkRBAC(ctx)...)
	out = append(out, c.checkRuntimeClasses(ctx)...)
	out = append(out, c.checkPools(ctx)...)
	out = append(out, c.checkNetworkPolicies(ctx)...)
	if c.Config.UnknownImage == config.UnknownImageCold {
		out = append(out, c.checkColdStartPolicy(ctx))
	}
	out = append(out, c.checkEgressProxies(ctx)...)
	if c.Options.Kubelet {
		out = append(out, c.checkKubelets(ctx)...)
	}
	if c.Config.StageServer != "" {
		out = append(out, c.checkStageServer(ctx))
	}
	return out
}

// stageServerTimeout bounds the stage server's answer to a ping: it answers at once.
const stageServerTimeout = 5 * time.Second

// checkStageServer asks the stage server that stage_server names whether it serves, and which
// build it runs: one started before an upgrade still runs the old one.
func (c *Checker) checkStageServer(ctx context.Context) Result {
	const check = "stage server"
	socket := c.Config.StageServer
	ctx, cancel := context.WithTimeout(ctx, stageServerTimeout)
	defer cancel()
	version, err := stageserver.Ping(ctx, socket)
	switch {
	case errors.Is(err, stageserver.ErrUnavailable):
		return Result{Warn, check, "nobody listens on " + socket + ": prepare and cleanup run in their own processes (slower)",
			"start sandbox-executor serve as the runner's user (docs/install.md#the-stage-server), or unset stage_server in " + c.Config.Path()}
	case err != nil:
		return Result{Fail, check, oneLine(err), "run sandbox-executor serve as the user gitlab-runner runs stages as, with stage_server in " + c.Config.Path() + " naming its socket"}
	case c.Version != "" && version != c.Version:
		return Result{Warn, check, fmt.Sprintf("%s runs version %s, this binary is %s: it refuses this build's stages, which run in their own processes (slower)", socket, version, c.Version), "restart sandbox-executor serve after an upgrade"}
	}
	return Result{OK, check, "listening on " + socket + " (version " + version + ")", ""}
}

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

// checkPools checks each configured pool, then the template of each pool that exists, and
// cold_template.
func (c *Checker) checkPools(ctx context.Context) []Result {
	ns := c.Config.Namespace
	var out []Result
	templates := map[string][]string{} // template -> what uses it: "pool x", "cold_template"
	var order []string
	useTemplate := func(template, user string) {
		if _, seen := templates[template]; !seen {
			order = append(order, template)
		}
		templates[template] = append(templates[template], user)
	}
	for _, p := range c.Config.Pools {
		check := "pool " + p.Name
		pool, err := c.Clients.WarmPool(ctx, ns, p.Name)
		switch {
		case apierrors.IsNotFound(err):
			out = append(out, Result{Fail, check, fmt.Sprintf("SandboxWarmPool %q not found in namespace %q", p.Name, ns),
				fmt.Sprintf("add it to the chart's pools values (helm upgrade) or correct the [[pool]] name in %s", c.Config.Path())})
			continue
		case err != nil:
			out = append(out, Result{Fail, check, oneLine(err), "check the API server and the chart's Role"})
			continue
		}
		out = append(out, poolResult(pool))
		useTemplate(pool.Spec.TemplateRef.Name, "pool "+p.Name)
	}
	if c.Config.UnknownImage == config.UnknownImageCold {
		useTemplate(c.Config.ColdTemplate, "cold_template")
	}
	for _, t := range order {
		out = append(out, c.checkTemplate(ctx, t, templates[t]))
	}
	return out
}

// checkNetworkPolicies finds each checked template's NetworkPolicy: with networkPolicyManagement
// Managed, agent-sandbox makes one per template (owned by it); a template without one leaves its
// pods' egress open.
func (c *Checker) checkNetworkPolicies(ctx context.Context) []Result {
	if len(c.templates) == 0 {
		return nil
	}
	ns := c.Config.Namespace
	policies, err := c.Clients.NetworkPolicies(ctx, ns)
	switch {
	case apierrors.IsForbidden(err):
		return []Result{{Warn, "networkpolicies", "cannot verify: this identity may not list networkpolicies in namespace " + ns, "bind the executor's identity to the chart's Role ...-doctor (helm upgrade)"}}
	case err != nil:
		return []Result{{Fail, "networkpolicies", oneLine(err), "check the API server"}}
	}
	var out []Result
	for _, t := range c.templates {
		check := "networkpolicy " + t.Name
		if t.Spec.NetworkPolicyManagement == extv1beta1.NetworkPolicyManagementUnmanaged {
			out = append(out, Result{Warn, check, "networkPolicyManagement Unmanaged: not checked", "set networkPolicyManagement Managed with a networkPolicy (the chart's templates do)"})
			continue
		}
		policy := templatePolicy(policies, t.Name)
		switch {
		case policy == nil:
			out = append(out, Result{Fail, check, "agent-sandbox has made no NetworkPolicy for template " + t.Name + ": its pods' egress is open",
				"check that the agent-sandbox controller runs (its logs) and that the cluster's network plugin enforces NetworkPolicy"})
		case !slices.Contains(policy.Spec.PolicyTypes, networkingv1.PolicyTypeEgress):
			out = append(out, Result{Fail, check, "NetworkPolicy " + policy.Name + " does not restrict egress", "give the template a networkPolicy with egress rules (the chart's templates have them)"})
		default:
			out = append(out, Result{OK, check, "NetworkPolicy " + policy.Name + " restricts ingress and egress", ""})
		}
	}
	return out
}

func templatePolicy(policies []networkingv1.NetworkPolicy, template string) *networkingv1.NetworkPolicy {
	for i := range policies {
		if owner := metav1.GetControllerOf(&policies[i]); owner != nil && owner.Kind == "SandboxTemplate" && owner.Name == template {
			return &policies[i]
		}
	}
	return nil
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

// checkEgressProxies asks each configured egress proxy's admin port for /healthz, as the run
// stage will ask it for blocked attempts.
func (c *Checker) checkEgressProxies(ctx context.Context) []Result {
	client := c.HTTP
	if client == nil {
		client = &http.Client{Timeout: 5 * time.Second}
	}
	var out []Result
	for _, p := range c.Config.Pools {
		if p.EgressProxy == "" {
			continue
		}
		check := "egress proxy " + p.Name
		url := strings.TrimSuffix(p.EgressProxy, "/") + "/healthz"
		const fix = "check the egress proxy's Deployment and Service (the chart's egressProxy.enabled), and that its NetworkPolicy admits this runner (label app.kubernetes.io/name=sandbox-executor-runner)"
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			out = append(out, Result{Fail, check, oneLine(err), "fix egress_proxy in " + c.Config.Path()})
			continue
		}
		resp, err := client.Do(req)
		if err != nil {
			out = append(out, Result{Fail, check, "admin port unreachable: " + oneLine(err), fix})
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			out = append(out, Result{Fail, check, url + " answered " + resp.Status, fix})
			continue
		}
		out = append(out, Result{OK, check, url + " answers", ""})
	}
	return out
}

func poolResult(pool *extv1beta1.SandboxWarmPool) Result {
	check := "pool " + pool.Name
	replicas := int32(1) // the CRD's default
	if pool.Spec.Replicas != nil {
		replicas = *pool.Spec.Replicas
	}
	ready := pool.Status.ReadyReplicas
	detail := fmt.Sprintf("%d of %d sandboxes Ready (template %s)", ready, replicas, pool.Spec.TemplateRef.Name)
	switch {
	case replicas == 0:
		return Result{Warn, check, detail + ": scaled to 0, every job waits for a cold start", "set spec.replicas to the number of jobs that usually start together"}
	case ready == 0:
		// Not a FAIL: a busy pool is drained while it refills, and jobs then wait for a sandbox
		// to start (up to ready_timeout). A pool that stays at 0 is broken.
		return Result{Warn, check, detail + ": jobs wait for sandboxes to start", fmt.Sprintf("if it stays at 0: kubectl -n %s describe sandboxwarmpool %s and the events of its pods (image pull, RuntimeClass handler missing on the nodes, quota)", pool.Namespace, pool.Name)}
	}
	return Result{OK, check, detail, ""}
}

func (c *Checker) checkTemplate(ctx context.Context, name string, users []string) Result {
	check := fmt.Sprintf("template %s (%s)", name, strings.Join(users, ", "))
	t, err := c.Clients.Template(ctx, c.Config.Namespace, name)
	switch {
	case apierrors.IsForbidden(err):
		return Result{Warn, check, "cannot verify: this identity may not get sandboxtemplates", "bind the executor's identity to the chart's Role (helm upgrade)"}
	case apierrors.IsNotFound(err):
		return Result{Fail, check, "SandboxTemplate not found: no sandbox can be made from it", "add it to the chart's templates values (helm upgrade), or fix the pool's template or cold_template"}
	case err != nil:
		return Result{Fail, check, oneLine(err), "check the API server"}
	}
	c.tolerations = append(c.tolerations, t.Spec.PodTemplate.Spec.Tolerations...)
	c.templates = append(c.templates, t)
	fails, warns := TemplateProblems(t, c.Config.RuntimeClasses, c.Config.RequireFence)
	switch {
	case len(fails) > 0:
		return Result{Fail, check, strings.Join(append(fails, warns...), "; "), "fix the SandboxTemplate (the chart's templates are hardened: deploy/chart/sandbox-executor)"}
	case len(warns) > 0:
		return Result{Warn, check, strings.Join(warns, "; "), "harden the SandboxTemplate (as the chart's are: deploy/chart/sandbox-executor)"}
	}
	rc := *t.Spec.PodTemplate.Spec.RuntimeClassName
	return Result{OK, check, "runtimeClassName " + rc + ", nothing privileged, no ServiceAccount token, limits set, egress restricted", ""}
}

// TemplateProblems lists what makes a template unusable (fails: the executor would refuse every
// pod) or weaker than it should be (warns).
func TemplateProblems(t *extv1beta1.SandboxTemplate, runtimeClasses []string, requireFence bool) (fails, warns []string) {
	spec := t.Spec.PodTemplate.Spec
	switch rc := spec.RuntimeClassName; {
	case rc == nil || *rc == "":
		fails = append(fails, "no runtimeClassName: pods run on the node's default runtime and the executor refuses them")
	case !slices.Contains(runtimeClasses, *rc):
		fails = append(fails, fmt.Sprintf("runtimeClassName %s is not in runtime_classes (%s): the executor refuses its pods", *rc, strings.Join(runtimeClasses, ", ")))
	}
	// agent-sandbox defaults an unset automountServiceAccountToken to false in templates.
	if spec.AutomountServiceAccountToken != nil && *spec.AutomountServiceAccountToken {
		warns = append(warns, "automountServiceAccountToken is true: jobs get a Kubernetes API token")
	}
	if spec.HostNetwork || spec.HostPID || spec.HostIPC {
		warns = append(warns, "shares the node's network, PID or IPC namespace")
	}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			warns = append(warns, "hostPath volume "+v.Name)
		}
	}
	for _, ctr := range allContainers(spec) {
		sc := ctr.SecurityContext
		if sc != nil && sc.Privileged != nil && *sc.Privileged {
			warns = append(warns, "container "+ctr.Name+" is privileged")
		}
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			warns = append(warns, "container "+ctr.Name+" allows privilege escalation")
		}
		var missing []string
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage} {
			if _, ok := ctr.Resources.Limits[r]; !ok {
				missing = append(missing, string(r))
			}
		}
		if len(missing) > 0 {
			warns = append(warns, "container "+ctr.Name+" has no "+strings.Join(missing, ", ")+" limit")
		}
	}
	switch {
	case t.Spec.NetworkPolicyManagement == extv1beta1.NetworkPolicyManagementUnmanaged:
		warns = append(warns, "networkPolicyManagement Unmanaged: egress is only restricted if you installed a NetworkPolicy yourself")
	case t.Spec.NetworkPolicy == nil:
		warns = append(warns, "no networkPolicy: agent-sandbox's default allows egress to the whole internet")
	}
	if len(spec.Containers) > 0 {
		switch problem := fenceProblem(&spec.Containers[0]); {
		case problem == "":
		case requireFence && strings.HasPrefix(problem, noFence):
			fails = append(fails, problem+" and require_fence is set: the executor refuses its pods")
		default:
			warns = append(warns, problem)
		}
	}
	return fails, warns
}

const noFence = "no egress fence check"

// fenceProblem says what the job container lacks for its egress fence to be checked: the
// addresses, and on a template that bakes the agent in, the readiness probe that keeps warm
// pods out of Ready while the fence is down.
func fenceProblem(job *corev1.Container) string {
	configured := slices.ContainsFunc(job.Env, func(e corev1.EnvVar) bool {
		return (e.Name == wire.FenceDenyEnv || e.Name == wire.FenceAllowEnv) && e.Value != ""
	})
	if !configured {
		return noFence + " (" + wire.FenceDenyEnv + ", " + wire.FenceAllowEnv + " on container " + job.Name + "): its pods are handed out even while NetworkPolicy is not enforced"
	}
	baked := len(job.Command) > 0 && job.Command[0] == wire.PodAgentPath
	probe := job.ReadinessProbe
	if baked && (probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Port.IntValue() != wire.FencePort) {
		return fmt.Sprintf("no readinessProbe httpGet on port %d: warm pods are Ready while their fence is down, and only prepare's own check refuses them", wire.FencePort)
	}
	return ""
}

func allContainers(spec corev1.PodSpec) []corev1.Container {
	return append(slices.Clone(spec.InitContainers), spec.Containers...)
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

func oneLine(err error) string { return failure.OneLine(err.Error()) }
