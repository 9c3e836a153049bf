package executor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandbox-executor/sandbox-executor/executor/agent"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
)

// Labels put on every claim, so that operators, gc and NetworkPolicies can find a job's claim.
const (
	LabelManagedBy  = "app.kubernetes.io/managed-by"
	LabelRunner     = "sandbox-executor.gitlab.io/runner"
	LabelJobID      = "sandbox-executor.gitlab.io/job-id"
	LabelProjectID  = "sandbox-executor.gitlab.io/project-id"
	LabelPipelineID = "sandbox-executor.gitlab.io/pipeline-id"
	ManagedByValue  = "sandbox-executor"
)

const (
	resourceClaims    = "sandboxclaims.extensions.agents.x-k8s.io"
	resourcePools     = "sandboxwarmpools.extensions.agents.x-k8s.io"
	resourceSandboxes = "sandboxes.agents.x-k8s.io"
	resourcePods      = "pods"
)

// Sandbox is a claimed job pod, ready for exec. It is what later stages need, so prepare
// saves it in the runner's per-job temporary directory.
type Sandbox struct {
	Namespace   string `json:"namespace"`
	Claim       string `json:"claim"`
	Pool        string `json:"pool"`
	SandboxName string `json:"sandbox"`
	Pod         string `json:"pod"`
	// PodUID tells the pod from a replacement of the same name.
	PodUID       string `json:"podUID"`
	Container    string `json:"container"`
	RuntimeClass string `json:"runtimeClass"`
	Warm         bool   `json:"warm"`
	// ColdTemplate is set when the job owns a Sandbox cold-started from this SandboxTemplate
	// (unknown_image = "cold") instead of a claim: Claim and Pool are then empty, and cleanup
	// deletes the Sandbox SandboxName.
	ColdTemplate string `json:"coldTemplate,omitempty"`
	PodIP        string `json:"podIP,omitempty"`
	// AgentToken authenticates the network path to the pod's stage daemon; empty: exec only.
	// It lives in the runner's per-job TMPDIR (0600) and in the pod, nowhere else.
	AgentToken string `json:"agentToken,omitempty"`
	// AgentBaked: the pod's template bakes the agent in (agent.PodAgentPath runs as the job
	// container's command, with stdin open), so its stage daemon runs from the pod's start.
	AgentBaked bool `json:"agentBaked,omitempty"`
	// Restarts is the job container's restart count when the job took the pod. A restart
	// (a memory or fork bomb ending the container, say) loses the job's processes, files and
	// the agent that runs its stages: a higher count ends the job at once.
	Restarts int32 `json:"restarts,omitempty"`
	// Overhead accumulates the executor's own time over the job's stages.
	Overhead Overhead `json:"overhead"`
}

// ClaimName is deterministic per runner and job, so that a prepare retried by the runner adopts
// the claim it already made. It fits a DNS label: claims may name cold-started pods.
func ClaimName(runner string, jobID int64) string {
	sum := sha256.Sum256([]byte(runner))
	return "job-" + strconv.FormatInt(jobID, 10) + "-" + hex.EncodeToString(sum[:])[:10]
}

// RunnerLabel makes a runner name fit a label value.
func RunnerLabel(runner string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(runner) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	s := b.String()
	if len(s) > 63 {
		s = s[:63]
	}
	return strings.Trim(s, "-_.")
}

// ClaimRequest describes the claim prepare makes for a job.
type ClaimRequest struct {
	Namespace      string
	Pool           string
	Runner         string
	Job            *Job
	Grace          time.Duration
	ReadyTimeout   time.Duration
	RuntimeClasses []string
}

// Claimer claims and releases sandboxes.
type Claimer struct {
	Clients *Clients
	// Now is the clock, replaced in tests.
	Now func() time.Time
	// Debugf, when set, gets a line per step with its time (the job log's debug lines).
	Debugf func(format string, args ...any)
}

// step reports a finished step and its duration in debug mode, and starts the next one.
func (c *Claimer) step(since *time.Time, format string, args ...any) {
	if c.Debugf == nil {
		return
	}
	now := c.now()
	c.Debugf("%s in %s", fmt.Sprintf(format, args...), Millis(now.Sub(*since)))
	*since = now
}

func (c *Claimer) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// PoolStatus is what prepare reports about the pool before claiming from it.
type PoolStatus struct {
	Replicas, Ready int32
}

// CheckPool confirms the pool exists (and, with it, that the CRDs are installed).
func (c *Claimer) CheckPool(ctx context.Context, namespace, pool string) (PoolStatus, error) {
	p, err := c.Clients.Extensions.ExtensionsV1beta1().SandboxWarmPools(namespace).Get(ctx, pool, metav1.GetOptions{})
	if isObjectNotFound(err) {
		return PoolStatus{}, PermanentError(nil, "SandboxWarmPool %q not found in namespace %q: create it or fix [[pool]] name in the executor config", pool, namespace)
	}
	if err != nil {
		return PoolStatus{}, explainAPIError(err, apiCall{"get", resourcePools, namespace, pool})
	}
	status := PoolStatus{Ready: p.Status.ReadyReplicas}
	if p.Spec.Replicas != nil {
		status.Replicas = *p.Spec.Replicas
	}
	return status, nil
}

// WaitPoolReady watches the pool until it has a ready sandbox, for up to timeout.
func (c *Claimer) WaitPoolReady(ctx context.Context, namespace, pool string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pools := c.Clients.Extensions.ExtensionsV1beta1().SandboxWarmPools(namespace)
	selector := fields.OneTermEqualSelector("metadata.name", pool).String()
	for attempt := 0; ; attempt++ {
		// List then watch from its resourceVersion: no readiness change falls between the two.
		list, err := pools.List(ctx, metav1.ListOptions{FieldSelector: selector})
		if err == nil && len(list.Items) == 1 && list.Items[0].Status.ReadyReplicas > 0 {
			return nil
		}
		var w watch.Interface
		if err == nil {
			w, err = pools.Watch(ctx, metav1.ListOptions{FieldSelector: selector, ResourceVersion: list.ResourceVersion})
		}
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			if apiErr := explainAPIError(err, apiCall{"watch", resourcePools, namespace, pool}); KindOf(apiErr) == KindPermanent {
				return apiErr
			}
		} else {
			for ev := range w.ResultChan() {
				if p, ok := ev.Object.(*extv1beta1.SandboxWarmPool); ok && p.Status.ReadyReplicas > 0 {
					w.Stop()
					return nil
				}
			}
			w.Stop()
		}
		select {
		case <-ctx.Done():
		case <-time.After(DefaultBackoff(attempt + 1)):
			continue
		}
		break
	}
	return SystemError(nil, "warm pool %s/%s had no ready sandbox for %s (drained_pool = \"wait\"): add replicas or use drained_pool = \"cold\"", namespace, pool, timeout)
}

// Claim creates the job's claim, or adopts it if a retried prepare already made it, and waits
// until its sandbox is Ready and verified.
func (c *Claimer) Claim(ctx context.Context, req ClaimRequest) (*Sandbox, error) {
	name := ClaimName(req.Runner, req.Job.ID)
	claims := c.Clients.Extensions.ExtensionsV1beta1().SandboxClaims(req.Namespace)
	shutdown := c.shutdownTime(req)
	want := &extv1beta1.SandboxClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: req.Namespace,
			Labels:    jobLabels(req),
		},
		Spec: extv1beta1.SandboxClaimSpec{
			WarmPoolRef: extv1beta1.SandboxWarmPoolRef{Name: req.Pool},
			// Delete, not the default Retain: a runner that dies never runs cleanup, and the
			// claim must not outlive the job by more than the grace period.
			Lifecycle: &extv1beta1.Lifecycle{ShutdownTime: &shutdown, ShutdownPolicy: extv1beta1.ShutdownPolicyDelete},
		},
	}
	since := c.now()
	claim, err := createOrAdopt(ctx, claims, want, "SandboxClaim", resourceClaims)
	if err != nil {
		return nil, err
	}
	c.step(&since, "SandboxClaim %s created", name)
	ready, err := c.waitClaimReady(ctx, claim, req.ReadyTimeout)
	if err != nil {
		return nil, err
	}
	c.step(&since, "SandboxClaim Ready on Sandbox %s", ready.Status.SandboxStatus.Name)
	sbx, err := c.Resolve(ctx, ready, req.RuntimeClasses)
	if err == nil {
		c.step(&since, "pod %s found and verified (runtime %s)", sbx.Pod, sbx.RuntimeClass)
	}
	return sbx, err
}

// creator is the part of a typed client that createOrAdopt uses.
type creator[T any] interface {
	Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error)
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
}

// createOrAdopt creates the job's object, or adopts the one a retried prepare already made: it
// must carry this job's label and not be on its way out.
func createOrAdopt[T metav1.Object](ctx context.Context, client creator[T], want T, kind, resource string) (T, error) {
	var none T
	ns, name := want.GetNamespace(), want.GetName()
	got, err := client.Create(ctx, want, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		got, err = client.Get(ctx, name, metav1.GetOptions{})
		if err == nil && got.GetLabels()[LabelJobID] != want.GetLabels()[LabelJobID] {
			return none, PermanentError(nil, "%s %s/%s exists but belongs to another job", kind, ns, name)
		}
		if err == nil && got.GetDeletionTimestamp() != nil {
			return none, SystemError(nil, "%s %s/%s from an earlier attempt is still being deleted", kind, ns, name)
		}
	}
	if err != nil {
		return none, explainAPIError(err, apiCall{"create", resource, ns, name})
	}
	return got, nil
}

// shutdownTime is when agent-sandbox deletes what the job made even if cleanup never runs: the
// job's timeout plus claim_grace from now.
func (c *Claimer) shutdownTime(req ClaimRequest) metav1.Time {
	return metav1.NewTime(c.now().Add(req.Job.Timeout + req.Grace).Truncate(time.Second))
}

// jobLabels are put on everything prepare creates for a job.
func jobLabels(req ClaimRequest) map[string]string {
	labels := map[string]string{
		LabelManagedBy: ManagedByValue,
		LabelRunner:    RunnerLabel(req.Runner),
		LabelJobID:     strconv.FormatInt(req.Job.ID, 10),
	}
	if req.Job.ProjectID > 0 {
		labels[LabelProjectID] = strconv.FormatInt(req.Job.ProjectID, 10)
	}
	if req.Job.PipelineID > 0 {
		labels[LabelPipelineID] = strconv.FormatInt(req.Job.PipelineID, 10)
	}
	return labels
}

// ClaimReady reports whether the claim is Ready with a sandbox.
func ClaimReady(claim *extv1beta1.SandboxClaim) bool { ok, _ := claimReady(claim); return ok }

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
		resource: resourceClaims,
		origin:   "pool " + claim.Spec.WarmPoolRef.Name,
		client:   c.Clients.Extensions.ExtensionsV1beta1().SandboxClaims(claim.Namespace),
		state:    claimState,
	}, claim, timeout)
}

// Resolve finds the pod behind a Ready claim and fails closed unless it runs an allowed
// RuntimeClass and belongs to this claim.
func (c *Claimer) Resolve(ctx context.Context, claim *extv1beta1.SandboxClaim, runtimeClasses []string) (*Sandbox, error) {
	ns, name := claim.Namespace, claim.Status.SandboxStatus.Name
	// The pod is almost always named like its Sandbox: read both at once, and read the pod the
	// Sandbox names only if it names another (one round trip saved on every prepare).
	var guess podRead
	guessed := make(chan struct{})
	go func() {
		defer close(guessed)
		guess.pod, guess.err = c.Clients.Kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	}()
	sbx, err := c.Clients.Sandboxes.AgentsV1beta1().Sandboxes(ns).Get(ctx, name, metav1.GetOptions{})
	<-guessed
	if err != nil {
		return nil, explainAPIError(err, apiCall{"get", resourceSandboxes, ns, name})
	}
	out, err := c.verifiedSandbox(ctx, sbx, &guess, podOwner{claimUID: claim.UID, template: "the SandboxTemplate of pool " + claim.Spec.WarmPoolRef.Name}, runtimeClasses)
	if err != nil {
		return nil, err
	}
	out.Claim = claim.Name
	out.Pool = claim.Spec.WarmPoolRef.Name
	return out, nil
}

// podRead is a pod read ahead, by the name its Sandbox most likely gives it.
type podRead struct {
	pod *corev1.Pod
	err error
}

// verifiedSandbox reads the sandbox's pod (or takes ahead's, when that is the pod the Sandbox
// names), refuses it unless verifyPod passes, and describes it.
func (c *Claimer) verifiedSandbox(ctx context.Context, sbx *sandboxv1beta1.Sandbox, ahead *podRead, owner podOwner, runtimeClasses []string) (*Sandbox, error) {
	ns := sbx.Namespace
	podName := sbx.Annotations[sandboxv1beta1.SandboxPodNameAnnotation]
	if podName == "" {
		podName = sbx.Name
	}
	var pod *corev1.Pod
	var err error
	if ahead != nil && podName == sbx.Name {
		pod, err = ahead.pod, ahead.err
	} else {
		pod, err = c.Clients.Kube.CoreV1().Pods(ns).Get(ctx, podName, metav1.GetOptions{})
	}
	if err != nil {
		return nil, explainAPIError(err, apiCall{"get", resourcePods, ns, podName})
	}
	if err := verifyPod(pod, owner, runtimeClasses); err != nil {
		return nil, err
	}
	out := &Sandbox{
		Namespace:    ns,
		SandboxName:  sbx.Name,
		Pod:          pod.Name,
		PodUID:       string(pod.UID),
		Container:    pod.Spec.Containers[0].Name,
		RuntimeClass: *pod.Spec.RuntimeClassName,
		Warm:         sbx.Labels[sandboxv1beta1.SandboxLaunchTypeLabel] == sandboxv1beta1.SandboxLaunchTypeWarm,
		PodIP:        pod.Status.PodIP,
		AgentBaked:   agentBaked(&pod.Spec.Containers[0]),
	}
	if cs := containerStatus(pod, out.Container); cs != nil {
		out.Restarts = cs.RestartCount
	}
	return out, nil
}

func agentBaked(c *corev1.Container) bool {
	return len(c.Command) > 0 && c.Command[0] == agent.PodAgentPath && c.Stdin
}

// podOwner is what a job pod must belong to, and the template that decides its isolation.
type podOwner struct {
	// claimUID: a claimed pod is labelled with its claim's UID.
	claimUID types.UID
	// coldStart: there is no claim; the pod is controlled by the job's own Sandbox sandboxUID
	// and labelled with no claim.
	coldStart  bool
	sandboxUID types.UID
	// template names the template to fix, for the refusal: "the SandboxTemplate of pool x".
	template string
}

// verifyPod is the fail-closed gate: no script runs in a pod that is not isolated as configured.
func verifyPod(pod *corev1.Pod, owner podOwner, runtimeClasses []string) error {
	rc := ""
	if pod.Spec.RuntimeClassName != nil {
		rc = *pod.Spec.RuntimeClassName
	}
	if !slices.Contains(runtimeClasses, rc) {
		shown := rc
		if shown == "" {
			shown = "none (the node's default runtime)"
		}
		return PermanentError(nil, "refusing pod %s/%s: runtimeClassName is %s, allowed: %s; fix %s",
			pod.Namespace, pod.Name, shown, strings.Join(runtimeClasses, ", "), owner.template)
	}
	claimUID := pod.Labels[extv1beta1.SandboxIDLabel]
	if owner.coldStart {
		if ref := metav1.GetControllerOf(pod); claimUID != "" || ref == nil || ref.UID != owner.sandboxUID {
			return SystemError(nil, "pod %s/%s is not the pod of the job's Sandbox", pod.Namespace, pod.Name)
		}
	} else if claimUID != "" && claimUID != string(owner.claimUID) {
		return SystemError(nil, "pod %s/%s belongs to another claim", pod.Namespace, pod.Name)
	}
	if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning {
		return SystemError(nil, "pod %s/%s is %s, not Running", pod.Namespace, pod.Name, podState(pod))
	}
	if len(pod.Spec.Containers) == 0 {
		return PermanentError(nil, "pod %s/%s has no containers", pod.Namespace, pod.Name)
	}
	return nil
}

func podState(pod *corev1.Pod) string {
	if pod.DeletionTimestamp != nil {
		return "being deleted"
	}
	if pod.Status.Reason != "" {
		state := string(pod.Status.Phase) + " (" + pod.Status.Reason
		if pod.Status.Message != "" {
			// An eviction says which limit the job ran into.
			state += ": " + oneLine(pod.Status.Message)
		}
		return state + ")"
	}
	return string(pod.Status.Phase)
}

// Release deletes the job's claim; the Sandbox and its pod are garbage-collected with it.
// A claim already gone is success, so cleanup may run any number of times.
func (c *Claimer) Release(ctx context.Context, namespace, claim string) error {
	return deleteIgnoringNotFound(ctx, c.Clients.Extensions.ExtensionsV1beta1().SandboxClaims(namespace), claim, apiCall{"delete", resourceClaims, namespace, claim})
}

// deleter is the part of a typed client that deleteIgnoringNotFound uses.
type deleter interface {
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// deleteIgnoringNotFound deletes the named object and what it owns (in the background); an object
// already gone is success.
func deleteIgnoringNotFound(ctx context.Context, client deleter, name string, call apiCall) error {
	policy := metav1.DeletePropagationBackground
	err := client.Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &policy})
	if err == nil || isObjectNotFound(err) {
		return nil
	}
	return explainAPIError(err, call)
}

// PodGone explains why a pod can no longer run stages, or returns "" while it still can.
func (c *Claimer) PodGone(ctx context.Context, sbx *Sandbox) (string, error) {
	pod, err := c.Clients.Kube.CoreV1().Pods(sbx.Namespace).Get(ctx, sbx.Pod, metav1.GetOptions{})
	if isObjectNotFound(err) {
		return fmt.Sprintf("pod %s/%s was deleted", sbx.Namespace, sbx.Pod), nil
	}
	if err != nil {
		return "", explainAPIError(err, apiCall{"get", resourcePods, sbx.Namespace, sbx.Pod})
	}
	if sbx.PodUID != "" && string(pod.UID) != sbx.PodUID {
		return fmt.Sprintf("pod %s/%s was deleted and replaced by a new pod of the same name", sbx.Namespace, sbx.Pod), nil
	}
	if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning {
		return fmt.Sprintf("pod %s/%s is %s", sbx.Namespace, sbx.Pod, podState(pod)), nil
	}
	return containerGone(pod, sbx), nil
}

// containerGone explains why the job container no longer holds the job: it restarted since the
// job took the pod, or it is not running. "" while it runs as it did.
func containerGone(pod *corev1.Pod, sbx *Sandbox) string {
	cs := containerStatus(pod, sbx.Container)
	if cs == nil {
		return ""
	}
	where := fmt.Sprintf("the job container %s of pod %s/%s", sbx.Container, sbx.Namespace, sbx.Pod)
	if term := cs.State.Terminated; term != nil {
		return fmt.Sprintf("%s terminated (%s); the job's processes and files are gone%s", where, termination(term), limitHint(pod, sbx.Container, term.Reason))
	}
	if cs.RestartCount > sbx.Restarts {
		why := "restarted"
		if term := cs.LastTerminationState.Terminated; term != nil {
			why += " after " + termination(term)
			return fmt.Sprintf("%s %s; the job's processes and files are gone%s", where, why, limitHint(pod, sbx.Container, term.Reason))
		}
		return fmt.Sprintf("%s %s; the job's processes and files are gone", where, why)
	}
	if w := cs.State.Waiting; w != nil && w.Reason != "" {
		return fmt.Sprintf("%s is waiting (%s)", where, w.Reason)
	}
	return ""
}

func containerStatus(pod *corev1.Pod, name string) *corev1.ContainerStatus {
	for i := range pod.Status.ContainerStatuses {
		if pod.Status.ContainerStatuses[i].Name == name {
			return &pod.Status.ContainerStatuses[i]
		}
	}
	return nil
}

func termination(t *corev1.ContainerStateTerminated) string {
	reason := t.Reason
	if reason == "" {
		reason = "no reason given"
	}
	return fmt.Sprintf("%s, exit code %d", reason, t.ExitCode)
}

// limitHint names the limit a job ran into, so the job log says what to change.
func limitHint(pod *corev1.Pod, container, reason string) string {
	if reason != "OOMKilled" {
		return ""
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == container {
			if mem, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
				return fmt.Sprintf(": the job used more than its memory limit of %s (the SandboxTemplate's resources.limits.memory)", mem.String())
			}
		}
	}
	return ": the job ran out of memory"
}

// ClaimInfo is what gc needs to know of a claim, or of a cold-started Sandbox.
type ClaimInfo struct {
	Namespace, Name, JobID string
	Created, ShutdownTime  time.Time
	Deleting               bool
	// ColdStart: a Sandbox of unknown_image = "cold" (ReleaseColdStart), not a claim.
	ColdStart bool
}

func jobObjectInfo(meta metav1.ObjectMeta, shutdown *metav1.Time, coldStart bool) ClaimInfo {
	info := ClaimInfo{Namespace: meta.Namespace, Name: meta.Name, JobID: meta.Labels[LabelJobID], Created: meta.CreationTimestamp.Time,
		Deleting: meta.DeletionTimestamp != nil, ColdStart: coldStart}
	if shutdown != nil {
		info.ShutdownTime = shutdown.Time
	}
	return info
}

func runnerSelector(runner string) metav1.ListOptions {
	return metav1.ListOptions{LabelSelector: LabelManagedBy + "=" + ManagedByValue + "," + LabelRunner + "=" + RunnerLabel(runner)}
}

// RunnerClaims lists the claims this executor made for runner.
func (c *Claimer) RunnerClaims(ctx context.Context, namespace, runner string) ([]ClaimInfo, error) {
	list, err := c.Clients.Extensions.ExtensionsV1beta1().SandboxClaims(namespace).List(ctx, runnerSelector(runner))
	if err != nil {
		return nil, explainAPIError(err, apiCall{"list", resourceClaims, namespace, ""})
	}
	out := make([]ClaimInfo, 0, len(list.Items))
	for _, cl := range list.Items {
		var shutdown *metav1.Time
		if cl.Spec.Lifecycle != nil {
			shutdown = cl.Spec.Lifecycle.ShutdownTime
		}
		out = append(out, jobObjectInfo(cl.ObjectMeta, shutdown, false))
	}
	return out, nil
}

// RunnerColdStarts lists the Sandboxes this executor cold-started for runner.
func (c *Claimer) RunnerColdStarts(ctx context.Context, namespace, runner string) ([]ClaimInfo, error) {
	list, err := c.Clients.Sandboxes.AgentsV1beta1().Sandboxes(namespace).List(ctx, runnerSelector(runner))
	if err != nil {
		return nil, explainAPIError(err, apiCall{"list", resourceSandboxes, namespace, ""})
	}
	var out []ClaimInfo
	for i := range list.Items {
		if sbx := &list.Items[i]; isColdStart(sbx) {
			out = append(out, jobObjectInfo(sbx.ObjectMeta, sbx.Spec.ShutdownTime, true))
		}
	}
	return out, nil
}
