package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/client-go/util/retry"
)

// The agent-sandbox controller runs in-cluster: a Deployment (tests/cluster/agent-sandbox.sh
// applies the module's k8s/ kustomization). The bench reads its args from the Deployment, its
// metrics through the API server's pod proxy and its CPU from its process on this node, and may
// run rounds with other args, always putting the original ones back.

// originalArgsAnnotation keeps the args as found on the Deployment while a setting is applied, so
// a run that dies before restoring (SIGKILL, a crash) is undone by the next run.
const originalArgsAnnotation = "sandbox-executor.local/scale-bench-original-args"

// rolloutTimeout bounds a rollout of the controller; a controller that rejects a flag crash-loops
// and never becomes available, which this turns into an error naming the pod's state.
const rolloutTimeout = 3 * time.Minute

// controller is the agent-sandbox controller's Deployment and what the bench learned about it.
type controller struct {
	kube            kubernetes.Interface
	namespace, name string
	// container is the index of the controller's container in the pod template.
	container int
	// original is the container's args as found; restoring puts exactly these back.
	original []string
	// patched is true while a setting other than the original args is applied.
	patched bool
	// serviceAccount is the one the controller's pods run as.
	serviceAccount string
	// replicaSets are the names of the Deployment's ReplicaSets as found: restoring deletes the
	// others once they are scaled to 0, the history of the settings' rollouts.
	replicaSets map[string]bool
}

// parseDeployment splits "namespace/name".
func parseDeployment(s string) (namespace, name string, err error) {
	namespace, name, ok := strings.Cut(s, "/")
	if !ok || namespace == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("-controller: %q is not namespace/deployment", s)
	}
	return namespace, name, nil
}

// parseSetting splits one -controller-flags value into controller flags. Only --name=value and
// --name forms are accepted, so a flag given replaces the same flag of the original args exactly.
func parseSetting(s string) ([]string, error) {
	args := strings.Fields(s)
	for _, a := range args {
		if flagName(a) == "" {
			return nil, fmt.Errorf("-controller-flags: %q is not --name or --name=value", a)
		}
	}
	return args, nil
}

// argFlagName is the flag an argument sets, given with one dash or two; "" for a value.
func argFlagName(a string) string {
	if !strings.HasPrefix(a, "-") {
		return ""
	}
	return flagName("--" + strings.TrimLeft(a, "-"))
}

// flagName is the name of a --name[=value] argument, or "" if a is not one.
func flagName(a string) string {
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
		replaced[flagName(a)] = true
	}
	out := slices.DeleteFunc(slices.Clone(original), func(a string) bool {
		return replaced[argFlagName(a)]
	})
	return append(out, extra...)
}

// findController reads the Deployment and, if an earlier run died with its own args applied,
// restores the args it recorded first.
func findController(ctx context.Context, kube kubernetes.Interface, namespace, name string) (*controller, error) {
	d, err := kube.AppsV1().Deployments(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("agent-sandbox controller Deployment %s/%s: %w", namespace, name, err)
	}
	c := &controller{kube: kube, namespace: namespace, name: name}
	containers := d.Spec.Template.Spec.Containers
	c.container = slices.IndexFunc(containers, func(ct corev1.Container) bool { return ct.Name == name })
	if c.container < 0 {
		if len(containers) != 1 {
			return nil, fmt.Errorf("controller Deployment %s/%s: %d containers and none named %s: which one is the controller?", namespace, name, len(containers), name)
		}
		c.container = 0
	}
	c.original = slices.Clone(containers[c.container].Args)
	c.serviceAccount = d.Spec.Template.Spec.ServiceAccountName
	sets, err := c.ownReplicaSets(ctx, d)
	if err != nil {
		return nil, err
	}
	c.replicaSets = map[string]bool{}
	for _, rs := range sets {
		c.replicaSets[rs.Name] = true
	}
	if recorded, ok := d.Annotations[originalArgsAnnotation]; ok {
		if err := json.Unmarshal([]byte(recorded), &c.original); err != nil {
			return nil, fmt.Errorf("controller Deployment %s/%s: annotation %s: %w", namespace, name, originalArgsAnnotation, err)
		}
		logf("controller %s/%s still has the args of an aborted run: restoring %q", namespace, name, c.original)
		c.patched = true
		if err := c.restore(ctx); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// apply rolls the controller out with extra merged into its original args, recording the
// originals on the Deployment first, and waits until the new pod leads. No extra flags is the
// args as found: restored if an earlier setting changed them.
func (c *controller) apply(ctx context.Context, extra []string) error {
	if len(extra) == 0 {
		return c.restore(ctx)
	}
	recorded, err := json.Marshal(c.original)
	if err != nil {
		return err
	}
	args := mergeArgs(c.original, extra)
	logf("controller %s/%s: rolling out with args %q", c.namespace, c.name, args)
	c.patched = true
	if err := c.update(ctx, func(d *appsv1.Deployment) {
		metav1.SetMetaDataAnnotation(&d.ObjectMeta, originalArgsAnnotation, string(recorded))
		d.Spec.Template.Spec.Containers[c.container].Args = args
	}); err != nil {
		return err
	}
	return c.waitRolledOut(ctx)
}

// restore puts the original args back, removes the record of them and waits for the rollout.
// It runs on every exit path, after an interrupt too, so it ignores the caller's cancellation
// and has its own bound.
func (c *controller) restore(ctx context.Context) error {
	if !c.patched {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*rolloutTimeout)
	defer cancel()
	logf("controller %s/%s: restoring its original args %q", c.namespace, c.name, c.original)
	if err := c.update(ctx, func(d *appsv1.Deployment) {
		delete(d.Annotations, originalArgsAnnotation)
		d.Spec.Template.Spec.Containers[c.container].Args = slices.Clone(c.original)
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
func (c *controller) ownReplicaSets(ctx context.Context, d *appsv1.Deployment) ([]appsv1.ReplicaSet, error) {
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return nil, err
	}
	list, err := c.kube.AppsV1().ReplicaSets(c.namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(list.Items, func(rs appsv1.ReplicaSet) bool { return !metav1.IsControlledBy(&rs, d) }), nil
}

// deleteSettingReplicaSets deletes the ReplicaSets the settings' rollouts left, scaled to 0, so
// the Deployment's history is as found.
func (c *controller) deleteSettingReplicaSets(ctx context.Context) error {
	d, err := c.kube.AppsV1().Deployments(c.namespace).Get(ctx, c.name, metav1.GetOptions{})
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
		if err := c.kube.AppsV1().ReplicaSets(c.namespace).Delete(ctx, rs.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting ReplicaSet %s/%s of a controller setting: %w", c.namespace, rs.Name, err)
		}
	}
	return nil
}

func (c *controller) update(ctx context.Context, change func(*appsv1.Deployment)) error {
	deployments := c.kube.AppsV1().Deployments(c.namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		d, err := deployments.Get(ctx, c.name, metav1.GetOptions{})
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
// identity is the pod name, "_", a UUID).
func (c *controller) waitRolledOut(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, rolloutTimeout)
	defer cancel()
	deployments := c.kube.AppsV1().Deployments(c.namespace)
	byName := fields.OneTermEqualSelector("metadata.name", c.name).String()
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
		args = d.Spec.Template.Spec.Containers[c.container].Args
		return rolledOut(d)
	})
	if err != nil {
		return fmt.Errorf("controller %s/%s not rolled out after %s: %w (pods: %s)", c.namespace, c.name, rolloutTimeout, err, c.podStates(context.WithoutCancel(ctx)))
	}
	pod, err := c.pod(ctx)
	if err != nil {
		return err
	}
	if leaderElection(args) {
		leases := c.kube.CoordinationV1().Leases(c.namespace)
		_, err = watchtools.UntilWithSync(ctx, c.listWatch(func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return leases.List(ctx, o)
		}, leases.Watch), &coordinationv1.Lease{}, nil, func(ev watch.Event) (bool, error) {
			l, ok := ev.Object.(*coordinationv1.Lease)
			return ok && l.Spec.HolderIdentity != nil && strings.HasPrefix(*l.Spec.HolderIdentity, pod.Name+"_"), nil
		})
		if err != nil {
			return fmt.Errorf("controller pod %s/%s did not take the leader lease: %w", c.namespace, pod.Name, err)
		}
	}
	logf("controller %s/%s rolled out: pod %s leads", c.namespace, c.name, pod.Name)
	return nil
}

// listWatch is what UntilWithSync lists and watches; it streams the initial list when the client
// can (fake clientsets cannot).
func (c *controller) listWatch(list func(context.Context, metav1.ListOptions) (runtime.Object, error), watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) cache.ListerWatcher {
	return cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{ListWithContextFunc: list, WatchFuncWithContext: watchFn}, c.kube)
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

// pod is the controller's one running pod (the Deployment's selector, not being deleted).
func (c *controller) pod(ctx context.Context) (*corev1.Pod, error) {
	pods, err := c.pods(ctx)
	if err != nil {
		return nil, err
	}
	pods = slices.DeleteFunc(pods, func(p corev1.Pod) bool { return p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning })
	if len(pods) != 1 {
		return nil, fmt.Errorf("controller %s/%s: %d running pods, want 1", c.namespace, c.name, len(pods))
	}
	return &pods[0], nil
}

func (c *controller) pods(ctx context.Context) ([]corev1.Pod, error) {
	d, err := c.kube.AppsV1().Deployments(c.namespace).Get(ctx, c.name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return nil, err
	}
	list, err := c.kube.CoreV1().Pods(c.namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// podStates names each pod of the controller with why it is not running, for a failed rollout.
func (c *controller) podStates(ctx context.Context) string {
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

// controllerMetrics scrapes the controller pod's metrics port through the API server's pod proxy
// (the port named "metrics", as the released manifest names it).
func (c *controller) metrics(ctx context.Context, pod *corev1.Pod) ([]byte, error) {
	port := ""
	for _, p := range pod.Spec.Containers[c.container].Ports {
		if p.Name == "metrics" {
			port = fmt.Sprint(p.ContainerPort)
		}
	}
	if port == "" {
		return nil, fmt.Errorf("controller pod %s: no container port named metrics", pod.Name)
	}
	return c.kube.CoreV1().Pods(pod.Namespace).ProxyGet("http", pod.Name, port, "metrics", nil).DoRaw(ctx)
}

// containerState is the ID of the controller's container in pod and the pod's restart count of it.
func (c *controller) containerState(pod *corev1.Pod) (id string, restarts int32) {
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == pod.Spec.Containers[c.container].Name {
			return s.ContainerID, s.RestartCount
		}
	}
	return "", 0
}

// logRestart says why the controller's container restarted: its last state and the end of the
// previous container's log (the lines it exited with).
func (c *controller) logRestart(ctx context.Context) {
	pod, err := c.pod(ctx)
	if err != nil {
		logf("the controller restarted during the burst: %v", err)
		return
	}
	name := pod.Spec.Containers[c.container].Name
	state := "unknown"
	for _, s := range pod.Status.ContainerStatuses {
		if t := s.LastTerminationState.Terminated; s.Name == name && t != nil {
			state = fmt.Sprintf("exit code %d, %s, at %s", t.ExitCode, t.Reason, t.FinishedAt.UTC().Format(time.TimeOnly))
		}
	}
	tail := int64(8)
	raw, err := c.kube.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: name, Previous: true, TailLines: &tail}).DoRaw(ctx)
	if err != nil {
		raw = []byte(err.Error())
	}
	logf("the controller's container restarted during the burst (%s); its last lines:\n%s", state, raw)
}

// containerPID finds the main process of the pod's controller container on this node: the
// lowest PID whose cgroup path names the container's ID (the runtime puts the ID in it, with
// either cgroup driver).
func (c *controller) containerPID(pod *corev1.Pod) (string, error) {
	var id string
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == pod.Spec.Containers[c.container].Name && s.State.Running != nil {
			_, id, _ = strings.Cut(s.ContainerID, "://")
		}
	}
	if id == "" {
		return "", fmt.Errorf("controller pod %s: container not running", pod.Name)
	}
	return pidInCgroup("/proc", id)
}

// pidInCgroup is the lowest PID under procRoot whose cgroup file mentions id.
func pidInCgroup(procRoot, id string) (string, error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return "", err
	}
	best := -1
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil || fmt.Sprint(pid) != e.Name() {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "cgroup"))
		if err != nil || !strings.Contains(string(raw), id) {
			continue
		}
		if best < 0 || pid < best {
			best = pid
		}
	}
	if best < 0 {
		return "", fmt.Errorf("no process of container %.12s on this node: run the bench on the cluster's node", id)
	}
	return fmt.Sprint(best), nil
}

// workers is what the controller reports as its SandboxClaim and Sandbox workers
// (controller_runtime_max_concurrent_reconciles): proof that a setting took effect.
func workers(m map[string]float64) string {
	claim, okClaim := m[`controller_runtime_max_concurrent_reconciles{controller="sandboxclaim"}`]
	sandbox, okSandbox := m[`controller_runtime_max_concurrent_reconciles{controller="sandbox"}`]
	if !okClaim || !okSandbox {
		return "unknown"
	}
	return fmt.Sprintf("%.0f SandboxClaim, %.0f Sandbox", claim, sandbox)
}

// priorityLevel asks the API server which API priority and fairness level it puts the
// controller's requests in: a request made as the controller's ServiceAccount (impersonated)
// comes back with the level's UID in a response header. The request reads sandboxes of the bench
// namespace, the kind of request the controller makes most.
func priorityLevel(ctx context.Context, cfg *rest.Config, kube kubernetes.Interface, namespace, serviceAccount, benchNamespace string) (string, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + namespace + ":" + serviceAccount,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
	}
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return "", err
	}
	defer client.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(cfg.Host, "/")+"/apis/agents.x-k8s.io/v1beta1/namespaces/"+benchNamespace+"/sandboxes?limit=1", nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	resp.Body.Close()
	uid := resp.Header.Get(flowcontrolv1.ResponseHeaderMatchedPriorityLevelConfigurationUID)
	if uid == "" {
		return "", errors.New("the API server named no priority level (API priority and fairness off?)")
	}
	levels, err := kube.FlowcontrolV1().PriorityLevelConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	for _, l := range levels.Items {
		if string(l.UID) == uid {
			return l.Name, nil
		}
	}
	return "", fmt.Errorf("no priority level with UID %s", uid)
}
