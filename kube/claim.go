package kube

import (
	"context"
	"errors"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/failure"
)

// Claim creates the job's claim, or adopts it if a retried prepare already made it, and waits
// until its sandbox is Ready and verified.
func (c *Claimer) Claim(ctx context.Context, req ClaimRequest) (*Sandbox, error) {
	name := req.Name
	if name == "" {
		return nil, failure.SystemError(nil, "no claim name for job %d: the request must name its claim (kube.ClaimName)", req.Job.ID)
	}
	claims := c.clients.Extensions.ExtensionsV1beta1().SandboxClaims(req.Namespace)
	shutdown := c.shutdownTime(req)
	want := &extv1beta1.SandboxClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Namespace:   req.Namespace,
			Labels:      jobLabels(req.Job, req.Runner),
			Annotations: bindingAnnotation(req.Binding),
		},
		Spec: extv1beta1.SandboxClaimSpec{
			WarmPoolRef: extv1beta1.SandboxWarmPoolRef{Name: req.Pool},
			// Delete, not the default Retain: a runner that dies never runs cleanup, and the
			// claim must not outlive the job by more than the grace period.
			Lifecycle: &extv1beta1.Lifecycle{ShutdownTime: &shutdown, ShutdownPolicy: extv1beta1.ShutdownPolicyDelete},
		},
	}
	since := c.clock.Now()
	created := since
	claim, err := createOrAdopt(ctx, claims, want, "SandboxClaim", SandboxClaims.String())
	if err != nil {
		return nil, err
	}
	c.step(&since, "SandboxClaim %s created", name)
	sbx, adopted, err := c.awaitSandbox(ctx, claim, req)
	if err != nil {
		return nil, err
	}
	waited := c.clock.Since(created)
	how := "SandboxClaim Ready on Sandbox %s"
	if adopted {
		how = "Sandbox %s adopted by the claim and Ready"
	}
	logLine := "not read yet"
	switch {
	case sbx.agentLogAhead:
		logLine = "read ahead"
	case sbx.AgentLogLine != "":
		logLine = "read with the pod"
	}
	c.step(&since, how+", pod %s found and verified (runtime %s, first log line %s)", sbx.SandboxName, sbx.Pod, sbx.RuntimeClass, logLine)
	if sbx.Launch == LaunchWaited {
		// The wait as this prepare saw it, from the create to a verified sandbox: finer than the
		// objects' seconds (a retried prepare that adopts its claim sees only its own part).
		sbx.Waited = waited
	}
	return sbx, nil
}

// creator is the part of a typed client that createOrAdopt uses.
type creator[T any] interface {
	Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error)
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
}

// createOrAdopt creates the job's object, or adopts the one a retried prepare already made: it
// must carry this job's label and binding, and not be on its way out.
func createOrAdopt[T metav1.Object](ctx context.Context, client creator[T], want T, kind, resource string) (T, error) {
	var none T
	ns, name := want.GetNamespace(), want.GetName()
	got, err := client.Create(ctx, want, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		got, err = client.Get(ctx, name, metav1.GetOptions{})
		if err == nil && got.GetLabels()[LabelJobID] != want.GetLabels()[LabelJobID] {
			return none, failure.PermanentError(nil, "%s %s/%s exists but belongs to another job", kind, ns, name)
		}
		if err == nil && got.GetDeletionTimestamp() != nil {
			return none, failure.SystemError(nil, "%s %s/%s from an earlier attempt is still being deleted", kind, ns, name)
		}
		if err == nil && !boundTo(got, want.GetAnnotations()[AnnotationJobBinding]) {
			return none, otherJobError(kind, ns, name)
		}
	}
	if err != nil {
		return none, explainAPIError(err, apiCall{"create", resource, ns, name})
	}
	return got, nil
}

// claimReady reports whether the claim is Ready with a sandbox, and a description of where it
// stands otherwise.
func claimReady(claim *extv1beta1.SandboxClaim) (bool, string) {
	ready, _, why := claimState(claim)
	return ready, why
}

// permanentClaimReasons are Ready=False reasons that waiting cannot fix.
var permanentClaimReasons = []string{"TemplateNotFound", "WarmPoolNotFound", "VolumeClaimTemplatesError"}

func claimState(claim *extv1beta1.SandboxClaim) (ready, hopeless bool, why string) {
	ready, hopeless, why = readyState(claim.Status.Conditions, permanentClaimReasons)
	if ready && claim.Status.SandboxStatus.Name == "" {
		return false, false, "Ready=True but no sandbox named yet"
	}
	return ready, hopeless, why
}

// waitClaimReady watches the claim until Ready (waitReady).
func (c *Claimer) waitClaimReady(ctx context.Context, claim *extv1beta1.SandboxClaim, timeout time.Duration) (*extv1beta1.SandboxClaim, error) {
	return waitReady(ctx, readyWatch[*extv1beta1.SandboxClaim]{
		kind:     "SandboxClaim",
		resource: SandboxClaims.String(),
		origin:   "pool " + claim.Spec.WarmPoolRef.Name,
		client:   c.clients.Extensions.ExtensionsV1beta1().SandboxClaims(claim.Namespace),
		state:    claimState,
	}, claim, timeout)
}

// Resolve finds the pod behind a Ready claim and fails closed unless it runs an allowed
// RuntimeClass and belongs to this claim.
func (c *Claimer) Resolve(ctx context.Context, claim *extv1beta1.SandboxClaim, runtimeClasses []string) (*Sandbox, error) {
	return c.resolve(ctx, claim, runtimeClasses, false)
}

// resolve is Resolve, reading the job container's first log line too when agentLog is set.
func (c *Claimer) resolve(ctx context.Context, claim *extv1beta1.SandboxClaim, runtimeClasses []string, agentLog bool) (*Sandbox, error) {
	return c.resolveSandbox(ctx, claim, claim.Status.SandboxStatus.Name, nil, runtimeClasses, agentLog)
}

// resolveSandbox is resolve for the claim's Sandbox name, taking known as that Sandbox when the
// caller has it already (nil: read it).
func (c *Claimer) resolveSandbox(ctx context.Context, claim *extv1beta1.SandboxClaim, name string, known *sandboxv1beta1.Sandbox, runtimeClasses []string, agentLog bool) (*Sandbox, error) {
	ns := claim.Namespace
	// Only a line already there: a pod Ready with the fence's readiness probe has logged it.
	// Nothing is sent to the pod; the line counts only once the pod is verified below.
	var logLine string
	logged := make(chan struct{})
	// Read ahead by the stage server: taken below if the pod shows the same container instance.
	ahead := agentLog && c.clients.AgentLines != nil && c.clients.AgentLines.has(name)
	if agentLog && !ahead {
		go func() {
			defer close(logged)
			logLine, _ = headLogLine(ctx, c.clients.Kube, ns, name)
		}()
	} else {
		close(logged)
	}
	// The pod is almost always named like its Sandbox: read both at once, and read the pod the
	// Sandbox names only if it names another (one round trip saved on every prepare).
	var guess podRead
	guessed := make(chan struct{})
	go func() {
		defer close(guessed)
		guess.pod, guess.err = c.clients.Kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	}()
	sbx, err := known, error(nil)
	if sbx == nil {
		sbx, err = c.clients.Sandboxes.AgentsV1beta1().Sandboxes(ns).Get(ctx, name, metav1.GetOptions{})
	}
	<-guessed
	<-logged
	if err != nil {
		return nil, explainAPIError(err, apiCall{"get", Sandboxes.String(), ns, name})
	}
	owner := podOwner{claimUID: claim.UID, template: "the SandboxTemplate of pool " + claim.Spec.WarmPoolRef.Name}
	if ref := metav1.GetControllerOf(sbx); ref != nil && ref.UID == claim.UID {
		owner.sandboxUID = sbx.UID // adopted: its pod may not carry the claim's label yet
	}
	out, err := c.verifiedSandbox(ctx, sbx, &guess, owner, runtimeClasses)
	if err != nil {
		return nil, err
	}
	if out.Pod == name {
		out.AgentLogLine = logLine
		if ahead {
			// A miss leaves it empty: the agent's connection reads it then (FirstLogLine).
			out.AgentLogLine, out.agentLogAhead = c.clients.AgentLines.Lookup(guess.pod)
		}
	}
	out.Claim = claim.Name
	out.Pool = claim.Spec.WarmPoolRef.Name
	out.Launch = launchOf(claim, sbx)
	return out, nil
}

// launchOf says how the claim got its sandbox, from what agent-sandbox v0.5.6 records on the
// objects, not from the pool's state before the claim, which a refill can change in between:
//   - the launch-type label: the claim controller sets "warm" on a pool sandbox it adopts
//     (completeAdoption) and "cold" on one it creates for the claim when the pool has none to
//     hand out (createSandbox);
//   - an adopted sandbox's Ready condition against the claim's creationTimestamp: the Sandbox
//     controller moves lastTransitionTime only when Ready changes (meta.SetStatusCondition), and
//     adoption leaves the pod's readiness alone, so Ready=True since before the claim existed
//     means the pool handed out a Ready sandbox. Any other adopted sandbox was still booting
//     (getCandidate falls back to an unready pool sandbox rather than none) and the claim
//     waited for it.
//
// Both are written by the cluster and kept on the objects, so a later stage that finds the claim
// again reads the same answer. Both times have one-second resolution, from two clocks of one
// cluster (the API server's, the controller's): a Ready in the claim's own second counts as
// waited, so a wait is never called warm; at worst a sandbox that turned Ready less than a
// second before the claim is called waited. A sandbox without the label (a controller that does
// not set it) has no launch: "" is unknown.
func launchOf(claim *extv1beta1.SandboxClaim, sbx *sandboxv1beta1.Sandbox) Launch {
	switch sbx.Labels[sandboxv1beta1.SandboxLaunchTypeLabel] {
	case sandboxv1beta1.SandboxLaunchTypeCold:
		return LaunchCold
	case sandboxv1beta1.SandboxLaunchTypeWarm:
	default:
		return ""
	}
	ready := meta.FindStatusCondition(sbx.Status.Conditions, string(sandboxv1beta1.SandboxConditionReady))
	if ready != nil && ready.Status == metav1.ConditionTrue && ready.LastTransitionTime.Before(&claim.CreationTimestamp) {
		return LaunchWarm
	}
	return LaunchWaited
}

// Release deletes the job's claim, if it is bound to binding (AnyJob: whoever's it is); the
// Sandbox and its pod are garbage-collected with it. A claim already gone is success, so cleanup
// may run any number of times; a claim of another job is left alone (ErrOtherJob). A known
// outcome is written on the claim first, for the exporter (Outcome).
func (c *Claimer) Release(ctx context.Context, namespace, claim, binding string, outcome Outcome) error {
	return releaseBound(ctx, c.clients.Extensions.ExtensionsV1beta1().SandboxClaims(namespace), namespace, claim, binding, "SandboxClaim", SandboxClaims.String(), nil, outcome)
}

// ErrOtherJob is what a stage gets for an object of its name that another job made (with the
// same runner name and job ID): it never runs in, nor releases, that job's pod.
var ErrOtherJob = errors.New("bound to another job")

// otherJobError refuses another job's object, in one line naming it and how to clear it. It is
// permanent: a retry meets the same object.
func otherJobError(kind, namespace, name string) error {
	return failure.PermanentError(ErrOtherJob, "%s %s/%s was made by another job with the same runner name and job ID (a second GitLab instance, or another runner sharing runner_name): refusing its pod; if that job is over, delete it with kubectl delete %s %s -n %s, or sandbox-executor gc --delete after its shutdownTime",
		kind, namespace, name, strings.ToLower(kind), name, namespace)
}

// bindingAnnotation is the annotation that binds an object to the job with binding; none without.
func bindingAnnotation(binding string) map[string]string {
	if binding == "" {
		return nil
	}
	return map[string]string{AnnotationJobBinding: binding}
}

// getDeleter is the part of a typed client that releaseBound uses.
type getDeleter[T any] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (T, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// releaseBound deletes the named object and what it owns (in the background) if it is bound to
// binding; an object already gone, or one that skip says is not the job's kind of object, is
// success. The delete is conditional on the UID read: an object another job made under the name
// in between is not deleted. A known outcome is written on the object before the delete.
func releaseBound[T metav1.Object](ctx context.Context, client getDeleter[T], namespace, name, binding, kind, resource string, skip func(T) bool, outcome Outcome) error {
	opts := metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}
	if binding != AnyJob || outcome.Result != "" {
		got, err := client.Get(ctx, name, metav1.GetOptions{})
		if isObjectNotFound(err) {
			return nil
		}
		if err != nil {
			return explainAPIError(err, apiCall{"get", resource, namespace, name})
		}
		if skip != nil && skip(got) {
			return nil
		}
		if !boundTo(got, binding) {
			return otherJobError(kind, namespace, name)
		}
		opts.Preconditions = metav1.NewUIDPreconditions(string(got.GetUID()))
		recordOutcome(ctx, client, got, outcome)
	}
	err := client.Delete(ctx, name, opts)
	// Conflict: the UID precondition failed, the job's object is gone and another took its name.
	if err == nil || isObjectNotFound(err) || opts.Preconditions != nil && apierrors.IsConflict(err) {
		return nil
	}
	return explainAPIError(err, apiCall{"delete", resource, namespace, name})
}

// Find finds the job's sandbox again by the job's deterministic claim name: its claim, else the
// cold-started Sandbox of that name, either bound to binding. The stages after prepare need it
// when prepare left no state (runners without TMPDIR).
func (c *Claimer) Find(ctx context.Context, namespace, claimName, binding string, runtimeClasses []string) (*Sandbox, error) {
	claim, err := c.clients.Extensions.ExtensionsV1beta1().SandboxClaims(namespace).Get(ctx, claimName, metav1.GetOptions{})
	if isObjectNotFound(err) {
		if cold, err := c.findColdStart(ctx, namespace, claimName, binding, runtimeClasses); cold != nil || err != nil {
			return cold, err
		}
		return nil, failure.SystemError(nil, "SandboxClaim (or cold-started Sandbox) %s/%s is gone: the job's sandbox was released or expired", namespace, claimName)
	}
	if err != nil {
		return nil, explainAPIError(err, apiCall{"get", SandboxClaims.String(), namespace, claimName})
	}
	if !boundTo(claim, binding) {
		return nil, otherJobError("SandboxClaim", namespace, claimName)
	}
	if ok, why := claimReady(claim); !ok {
		// Prepare may have gone on from the adoption a status write before the claim's Ready:
		// the sandbox the claim controls, Ready, is there already (a watch starts with it).
		watchCtx, cancel := context.WithTimeout(ctx, adoptionLookup)
		adopted := <-c.watchAdoption(watchCtx, claim)
		cancel()
		if adopted == nil {
			return nil, failure.SystemError(nil, "SandboxClaim %s/%s is not Ready: %s", namespace, claimName, why)
		}
		return c.resolveSandbox(ctx, claim, adopted.Name, adopted, runtimeClasses, false)
	}
	return c.Resolve(ctx, claim, runtimeClasses)
}

// adoptionLookup bounds Find's look for an adopted sandbox: the watch's first events are the
// objects already there, so it answers in one round trip when there is one.
const adoptionLookup = 2 * time.Second
