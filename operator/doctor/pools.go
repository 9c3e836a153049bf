package doctor

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/gitlab"
)

// The warm pools and their SandboxTemplates.

// checkPools checks each configured pool, then the template of each pool that exists, and
// cold_template, then that each pool lists only the image its template runs.
func (c *Checker) checkPools(ctx context.Context) []Result {
	ns := c.Config.Namespace
	var out []Result
	templates := map[string][]string{} // template -> what uses it: "pool x", "cold_template"
	var order []string
	poolTemplates := map[string]string{} // pool -> its template
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
		c.pools = append(c.pools, pool)
		useTemplate(pool.Spec.TemplateRef.Name, "pool "+p.Name)
		poolTemplates[p.Name] = pool.Spec.TemplateRef.Name
	}
	if c.Config.UnknownImage == config.UnknownImageCold {
		useTemplate(c.Config.ColdTemplate, "cold_template")
	}
	for _, t := range order {
		out = append(out, c.checkTemplate(ctx, t, templates[t]))
	}
	return append(out, c.checkPoolImages(poolTemplates)...)
}

// checkPoolImages: each image a pool lists is the one its template runs, or every job naming it
// fails at prepare (a job runs in the image it asked for). Pools without images (reached as
// default_pool only) and templates that could not be read have nothing to compare.
func (c *Checker) checkPoolImages(poolTemplates map[string]string) []Result {
	var out []Result
	for _, p := range c.Config.Pools {
		i := slices.IndexFunc(c.templates, func(t *extv1beta1.SandboxTemplate) bool { return t.Name == poolTemplates[p.Name] })
		if len(p.Images) == 0 || i < 0 || len(c.templates[i].Spec.PodTemplate.Spec.Containers) == 0 {
			continue
		}
		check, runs := "pool "+p.Name+" images", c.templates[i].Spec.PodTemplate.Spec.Containers[0].Image
		others := slices.DeleteFunc(slices.Clone(p.Images), func(image string) bool { return config.SameImage(image, runs) })
		switch {
		case len(others) > 0:
			out = append(out, Result{Fail, check, fmt.Sprintf("template %s runs %s, not %s: jobs naming those fail at prepare", c.templates[i].Name, runs, strings.Join(others, ", ")),
				fmt.Sprintf("list only %s in the pool's images (the chart's pools[].images: its template's image), with serve_other_tags = true for other tags, in %s", runs, c.Config.Path())})
		case p.ServeOtherTags:
			out = append(out, Result{OK, check, runs + ", and other tags of it (serve_other_tags: their jobs run in " + runs + " with a warning)", ""})
		default:
			out = append(out, Result{OK, check, runs + ", exactly", ""})
		}
		if gitlab.IsFlowImage(runs) {
			out = append(out, nonoResult(p.Name, c.templates[i]))
		}
	}
	return out
}

// nonoResult says what becomes of GitLab's nono sandbox in a pool of one of GitLab's flow
// images: nothing doctor can check on the instance (its feature flag), but what its admin must
// know before turning it on.
func nonoResult(pool string, t *extv1beta1.SandboxTemplate) Result {
	runtime := ptr.Deref(t.Spec.PodTemplate.Spec.RuntimeClassName, "")
	return Result{OK, "pool " + pool + " nono", fmt.Sprintf("flows run in GitLab's flow image under gVisor (RuntimeClass %s), which implements no Landlock (google/gvisor#13439): "+
		"a flow GitLab wraps in nono (its feature flag duo_workflow_nono_sandbox) fails closed here with a job-log line saying so; keep that flag off on the instances these runners serve (docs/agent-config.md#nono)", runtime), ""}
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
