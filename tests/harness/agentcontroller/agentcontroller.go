// Package agentcontroller rolls the local cluster's agent-sandbox controller out with other args
// and puts the args it had back: the benchmarks that compare controller settings
// (tools/scale, the e2e suite's BenchmarkJobsBeforeRefills) use it.
//
// The controller runs in-cluster: a Deployment (tests/cluster/agent-sandbox.sh applies the
// module's k8s/ kustomization). A rollout counts as done when the new pod is the only one, holds
// the leader lease and is the ready endpoint of the conversion webhook's Service.
package agentcontroller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/client-go/util/retry"
)

// Where the local cluster runs the controller, as the released manifests name it.
const (
	Namespace = "agent-sandbox-system"
	Name      = "agent-sandbox-controller"
	// WebhookService is the Service the API server converts the CRDs' other versions through.
	WebhookService = "agent-sandbox-webhook-service"
)

// originalArgsAnnotation keeps the args as found on the Deployment while a setting is applied, so
// a run that dies before restoring (SIGKILL, a crash, a test's timeout) is undone by the next run
// of either bench. Its name is tools/scale's, where it began: a record left under it still counts.
const originalArgsAnnotation = "sandbox-executor.local/scale-bench-original-args"

// rolloutTimeout bounds a rollout of the controller; a controller that rejects a flag crash-loops
// and never becomes available, which this turns into an error naming the pod's state.
const rolloutTimeout = 3 * time.Minute

// Controller is the agent-sandbox controller's Deployment and what was learned about it.
type Controller struct {
	Kube            kubernetes.Interface
	Namespace, Name string
	// Container is the index of the controller's container in the pod template.
	Container int
	// Original is the container's args as found; restoring puts exactly these back.
	Original []string
	// ServiceAccount is the one the controller's pods run as.
	ServiceAccount string
	// patched is true while a setting other than the original args is applied.
	patched bool
	// replicaSets are the names of the Deployment's ReplicaSets as found: restoring deletes the
	// others once they are scaled to 0, the history of the settings' rollouts.
	replicaSets map[string]bool
	logf        func(format string, args ...any)
}

// argFlagName is the flag an argument sets, given with one dash or two; "" for a value.
func argFlagName(a string) string {
	if !strings.HasPrefix(a, "-") {
		return ""
	}
	return FlagName("--" + strings.TrimLeft(a, "-"))
}

// FlagName is the name of a --name[=value] argument, or "" if a is not one.
func FlagName(a string) string {
	if !strings.HasPrefix(a, "--") {
		return ""
	}
	name, _, _ := strings.Cut(a[2:], "=")
	if name == "" || strings.HasPrefix(name, "-") {
		return ""
	}
	return name
}

// mergeArgs is original with each of extra replacing any argument of the same flag name
// (-name and --name forms alike), extra appended in order.
func mergeArgs(original, extra []string) []string {
	replaced := map[string]bool{}
	for _, a := range extra {
		replaced[FlagName(a)] = true
	}
	out := slices.DeleteFunc(slices.Clone(original), func(a string) bool {
		return replaced[argFlagName(a)]
	})
	return append(out, extra...)
}

// Find reads the Deployment and, if an earlier run died with its own args applied, restores the
// args it recorded first. logf tells what it changes.
func Find(ctx context.Context, kube kubernetes.Interface, namespace, name string, logf func(format string, args ...any)) (*Controller, error) {
	d, err := kube.AppsV1().Deployments(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("agent-sandbox controller Deployment %s/%s: %w", namespace, name, err)
	}
	c := &Controller{Kube: kube, Namespace: namespace, Name: name, logf: logf}
	containers := d.Spec.Template.Spec.Containers
	c.Container = slices.IndexFunc(containers, func(ct corev1.Container) bool { return ct.Name == name })
	if c.Container < 0 {
		if len(containers) != 1 {
			return nil, fmt.Errorf("controller Deployment %s/%s: %d containers and none named %s: which one is the controller?", namespace, name, len(containers), name)
		}
		c.Container = 0
	}
	c.Original = slices.Clone(containers[c.Container].Args)
	c.ServiceAccount = d.Spec.Template.Spec.ServiceAccountName
	sets, err := c.ownReplicaSets(ctx, d)
	if err != nil {
		return nil, err
	}
	c.replicaSets = map[string]bool{}
	for _, rs := range sets {
		c.replicaSets[rs.Name] = true
	}
	if recorded, ok := d.Annotations[originalArgsAnnotation]; ok {
		if err := json.Unmarshal([]byte(recorded), &c.Original); err != nil {
			return nil, fmt.Errorf("controller Deployment %s/%s: annotation %s: %w", namespace, name, originalArgsAnnotation, err)
		}
		logf("controller %s/%s still has the args of an aborted run: restoring %q", namespace, name, c.Original)
		c.patched = true
		if err := c.Restore(ctx); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// WithArgs rolls the local cluster's controller out with extra merged into its args (each
// replacing the same flag) and waits until the new pod leads and the API server converts the
// CRDs through its webhook. It returns the func that rolls the args as found back out and waits
// the same way; a failed rollout is rolled back before WithArgs returns.
func WithArgs(ctx context.Context, kube kubernetes.Interface, logf func(format string, args ...any), extra ...string) (restore func(context.Context) error, err error) {
	c, err := Find(ctx, kube, Namespace, Name, logf)
	if err != nil {
		return nil, err
	}
	restore = func(ctx context.Context) error {
		if err := c.Restore(ctx); err != nil {
			return err
		}
		return waitConverting(context.WithoutCancel(ctx), kube)
	}
	if err := c.Apply(ctx, extra); err != nil {
		return nil, errors.Join(err, restore(ctx))
	}
	if err := waitConverting(ctx, kube); err != nil {
		return nil, errors.Join(err, restore(ctx))
	}
	return restore, nil
}

// convertedLists are the CRDs' lists at their served version that is not stored: the API server
// answers them by sending each stored object through the controller's webhook.
var convertedLists = []string{
	"/apis/agents.x-k8s.io/v1alpha1/sandboxes",
	"/apis/extensions.agents.x-k8s.io/v1alpha1/sandboxclaims",
	"/apis/extensions.agents.x-k8s.io/v1alpha1/sandboxtemplates",
	"/apis/extensions.agents.x-k8s.io/v1alpha1/sandboxwarmpools",
}

// waitConverting waits until the API server answers every one of convertedLists, as
// tests/cluster/check.sh proves the conversion path: a pod that has just become the webhook's
// endpoint may not listen yet.
func waitConverting(ctx context.Context, kube kubernetes.Interface) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var last error
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		for _, path := range convertedLists {
			// The core client may speak protobuf, which CRDs do not.
			if _, last = kube.CoreV1().RESTClient().Get().AbsPath(path).SetHeader("Accept", "application/json").DoRaw(ctx); last != nil {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("the API server does not convert through the controller's webhook: %w (last answer: %v)", err, last)
	}
	return nil
}

// Apply rolls the controller out with extra merged into its original args, recording the
// originals on the Deployment first, and waits until the new pod leads. No extra flags is the
// args as found: restored if an earlier setting changed them.
func (c *Controller) Apply(ctx context.Context, extra []string) error {
	if len(extra) == 0 {
		return c.Restore(ctx)
	}
	recorded, err := json.Marshal(c.Original)
	if err != nil {
		return err
	}
	args := mergeArgs(c.Original, extra)
	c.logf("controller %s/%s: rolling out with args %q", c.Namespace, c.Name, args)
	c.patched = true
	if err := c.update(ctx, func(d *appsv1.Deployment) {
		metav1.SetMetaDataAnnotation(&d.ObjectMeta, originalArgsAnnotation, string(recorded))
		d.Spec.Template.Spec.Containers[c.Container].Args = args
	}); err != nil {
		return err
	}
	return c.waitRolledOut(ctx)
}

// Restore puts the original args back, removes the record of them and waits for the rollout.
// It runs on every exit path, after an interrupt too, so it ignores the caller's cancellation
// and has its own bound.
func (c *Controller) Restore(ctx context.Context) error {
	if !c.patched {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*rolloutTimeout)
	defer cancel()
	c.logf("controller %s/%s: restoring its original args %q", c.Namespace, c.Name, c.Original)
	if err := c.update(ctx, func(d *appsv1.Deployment) {
		delete(d.Annotations, originalArgsAnnotation)
		d.Spec.Template.Spec.Containers[c.Container].Args = slices.Clone(c.Original)
	}); err != nil {
		return fmt.Errorf("restoring the controller's args (do it by hand: the Deployment's annotation %s has them): %w", originalArgsAnnotation, err)
	}
	if err := c.waitRolledOut(ctx); err != nil {
		return fmt.Errorf("restored the controller's args, but: %w", err)
	}
	c.patched = false
	return c.deleteSettingReplicaSets(ctx)
}

// ownReplicaSets are the ReplicaSets the Deployment d owns.
func (c *Controller) ownReplicaSets(ctx context.Context, d *appsv1.Deployment) ([]appsv1.ReplicaSet, error) {
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return nil, err
	}
	list, err := c.Kube.AppsV1().ReplicaSets(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(list.Items, func(rs appsv1.ReplicaSet) bool { return !metav1.IsControlledBy(&rs, d) }), nil
}

// deleteSettingReplicaSets deletes the ReplicaSets the settings' rollouts left, scaled to 0, so
// the Deployment's history is as found.
func (c *Controller) deleteSettingReplicaSets(ctx context.Context) error {
	d, err := c.Kube.AppsV1().Deployments(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	sets, err := c.ownReplicaSets(ctx, d)
	if err != nil {
		return err
	}
	for _, rs := range sets {
		if c.replicaSets[rs.Name] || rs.Spec.Replicas == nil || *rs.Spec.Replicas != 0 {
			continue
		}
		if err := c.Kube.AppsV1().ReplicaSets(c.Namespace).Delete(ctx, rs.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting ReplicaSet %s/%s of a controller setting: %w", c.Namespace, rs.Name, err)
		}
	}
	return nil
}

func (c *Controller) update(ctx context.Context, change func(*appsv1.Deployment)) error {
	deployments := c.Kube.AppsV1().Deployments(c.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		d, err := deployments.Get(ctx, c.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(d)
		_, err = deployments.Update(ctx, d, metav1.UpdateOptions{})
		return err
	})
}

// rolledOut says whether every replica runs the Deployment's current template and no older pod
// is left, as `kubectl rollout status` judges it plus the terminating pods (an old leader holds
// its lease until it is gone).
func rolledOut(d *appsv1.Deployment) (bool, error) {
	if d.Generation > d.Status.ObservedGeneration {
		return false, nil
	}
	for _, cond := range d.Status.Conditions {
		if cond.Type == appsv1.DeploymentProgressing && cond.Reason == "ProgressDeadlineExceeded" {
			return false, fmt.Errorf("controller Deployment %s/%s: %s", d.Namespace, d.Name, cond.Message)
		}
	}
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	s := d.Status
	terminating := s.TerminatingReplicas != nil && *s.TerminatingReplicas > 0
	return s.UpdatedReplicas == want && s.Replicas == want && s.AvailableReplicas == want && !terminating, nil
}

// waitRolledOut watches the Deployment until it has rolled out, then, with leader election on,
// the leases of its namespace until one of its current pods holds one (controller-runtime's
// identity is the pod name, "_", a UUID), then the webhook Service's endpoints until that pod is
// their only one and ready.
func (c *Controller) waitRolledOut(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, rolloutTimeout)
	defer cancel()
	deployments := c.Kube.AppsV1().Deployments(c.Namespace)
	byName := fields.OneTermEqualSelector("metadata.name", c.Name).String()
	var args []string
	_, err := watchtools.UntilWithSync(ctx, c.listWatch(func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		o.FieldSelector = byName
		return deployments.List(ctx, o)
	}, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		o.FieldSelector = byName
		return deployments.Watch(ctx, o)
	}), &appsv1.Deployment{}, nil, func(ev watch.Event) (bool, error) {
		d, ok := ev.Object.(*appsv1.Deployment)
		if !ok {
			return false, nil
		}
		args = d.Spec.Template.Spec.Containers[c.Container].Args
		return rolledOut(d)
	})
	if err != nil {
		return fmt.Errorf("controller %s/%s not rolled out after %s: %w (pods: %s)", c.Namespace, c.Name, rolloutTimeout, err, c.PodStates(context.WithoutCancel(ctx)))
	}
	pod, err := c.Pod(ctx)
	if err != nil {
		return err
	}
	if leaderElection(args) {
		leases := c.Kube.CoordinationV1().Leases(c.Namespace)
		_, err = watchtools.UntilWithSync(ctx, c.listWatch(func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return leases.List(ctx, o)
		}, leases.Watch), &coordinationv1.Lease{}, nil, func(ev watch.Event) (bool, error) {
			l, ok := ev.Object.(*coordinationv1.Lease)
			return ok && l.Spec.HolderIdentity != nil && strings.HasPrefix(*l.Spec.HolderIdentity, pod.Name+"_"), nil
		})
		if err != nil {
			return fmt.Errorf("controller pod %s/%s did not take the leader lease: %w", c.Namespace, pod.Name, err)
		}
	}
	if err := c.waitWebhookEndpoint(ctx, pod.Name); err != nil {
		return err
	}
	c.logf("controller %s/%s rolled out: pod %s leads", c.Namespace, c.Name, pod.Name)
	return nil
}

// waitWebhookEndpoint waits until the webhook Service's EndpointSlices list pod, ready, and no
// other endpoint (an old pod's, gone), as tests/cluster/agent-sandbox.sh waits after an install.
// A controller without the Service (not the released manifests) has nothing to wait for.
func (c *Controller) waitWebhookEndpoint(ctx context.Context, pod string) error {
	if _, err := c.Kube.CoreV1().Services(c.Namespace).Get(ctx, WebhookService, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	endpointSlices := c.Kube.DiscoveryV1().EndpointSlices(c.Namespace)
	ofService := discoveryv1.LabelServiceName + "=" + WebhookService
	var endpoints []discoveryv1.Endpoint
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		list, err := endpointSlices.List(ctx, metav1.ListOptions{LabelSelector: ofService})
		if err != nil {
			return false, err
		}
		endpoints = nil
		for _, s := range list.Items {
			endpoints = append(endpoints, s.Endpoints...)
		}
		return len(endpoints) == 1 && servesFrom(endpoints[0], pod), nil
	})
	if err != nil {
		return fmt.Errorf("webhook Service %s/%s: want pod %s as its only ready endpoint, have %s: %w", c.Namespace, WebhookService, pod, describeEndpoints(endpoints), err)
	}
	return nil
}

// servesFrom says whether the endpoint is pod's and ready.
func servesFrom(e discoveryv1.Endpoint, pod string) bool {
	return e.TargetRef != nil && e.TargetRef.Kind == "Pod" && e.TargetRef.Name == pod &&
		e.Conditions.Ready != nil && *e.Conditions.Ready
}

func describeEndpoints(endpoints []discoveryv1.Endpoint) string {
	if len(endpoints) == 0 {
		return "none"
	}
	var out []string
	for _, e := range endpoints {
		who := strings.Join(e.Addresses, ",")
		if e.TargetRef != nil {
			who = e.TargetRef.Name
		}
		out = append(out, fmt.Sprintf("%s (ready %v)", who, e.Conditions.Ready != nil && *e.Conditions.Ready))
	}
	return strings.Join(out, ", ")
}

// listWatch is what UntilWithSync lists and watches; it streams the initial list when the client
// can (fake clientsets cannot).
func (c *Controller) listWatch(list func(context.Context, metav1.ListOptions) (runtime.Object, error), watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) cache.ListerWatcher {
	return cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{ListWithContextFunc: list, WatchFuncWithContext: watchFn}, c.Kube)
}

// leaderElection says whether args leave leader election on (its default).
func leaderElection(args []string) bool {
	on := true
	for _, a := range args {
		if argFlagName(a) == "leader-elect" {
			on = !strings.HasSuffix(a, "=false")
		}
	}
	return on
}

// Pod is the controller's one running pod (the Deployment's selector, not being deleted).
func (c *Controller) Pod(ctx context.Context) (*corev1.Pod, error) {
	pods, err := c.pods(ctx)
	if err != nil {
		return nil, err
	}
	pods = slices.DeleteFunc(pods, func(p corev1.Pod) bool { return p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning })
	if len(pods) != 1 {
		return nil, fmt.Errorf("controller %s/%s: %d running pods, want 1", c.Namespace, c.Name, len(pods))
	}
	return &pods[0], nil
}

func (c *Controller) pods(ctx context.Context) ([]corev1.Pod, error) {
	d, err := c.Kube.AppsV1().Deployments(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return nil, err
	}
	list, err := c.Kube.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// PodStates names each pod of the controller with why it is not running, for a failed rollout.
func (c *Controller) PodStates(ctx context.Context) string {
	pods, err := c.pods(ctx)
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, p := range pods {
		state := string(p.Status.Phase)
		for _, s := range p.Status.ContainerStatuses {
			switch {
			case s.State.Waiting != nil:
				state = s.State.Waiting.Reason
			case s.LastTerminationState.Terminated != nil && !s.Ready:
				state = "exited " + s.LastTerminationState.Terminated.Reason
			}
		}
		out = append(out, p.Name+" "+state)
	}
	return strings.Join(out, ", ")
}
