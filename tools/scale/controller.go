package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/sandbox-executor/sandbox-executor/tests/harness/agentcontroller"
)

// The agent-sandbox controller runs in-cluster: a Deployment (tests/cluster/agent-sandbox.sh
// applies the module's k8s/ kustomization). The bench reads its args from the Deployment, its
// metrics through the API server's pod proxy and its CPU from its process on this node, and may
// run rounds with other args, always putting the original ones back.

// controller is the agent-sandbox controller's Deployment (tests/harness/agentcontroller rolls
// it out with a setting's args and back) and what the bench reads of its pod.
type controller struct {
	*agentcontroller.Controller
}

// findController reads the Deployment and, if an earlier run died with its own args applied,
// restores the args it recorded first.
func findController(ctx context.Context, kube kubernetes.Interface, namespace, name string) (*controller, error) {
	c, err := agentcontroller.Find(ctx, kube, namespace, name, logf)
	if err != nil {
		return nil, err
	}
	return &controller{c}, nil
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
		if agentcontroller.FlagName(a) == "" {
			return nil, fmt.Errorf("-controller-flags: %q is not --name or --name=value", a)
		}
	}
	return args, nil
}

// controllerMetrics scrapes the controller pod's metrics port through the API server's pod proxy
// (the port named "metrics", as the released manifest names it).
func (c *controller) metrics(ctx context.Context, pod *corev1.Pod) ([]byte, error) {
	port := ""
	for _, p := range pod.Spec.Containers[c.Container].Ports {
		if p.Name == "metrics" {
			port = fmt.Sprint(p.ContainerPort)
		}
	}
	if port == "" {
		return nil, fmt.Errorf("controller pod %s: no container port named metrics", pod.Name)
	}
	return c.Kube.CoreV1().Pods(pod.Namespace).ProxyGet("http", pod.Name, port, "metrics", nil).DoRaw(ctx)
}

// containerState is the ID of the controller's container in pod and the pod's restart count of it.
func (c *controller) containerState(pod *corev1.Pod) (id string, restarts int32) {
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == pod.Spec.Containers[c.Container].Name {
			return s.ContainerID, s.RestartCount
		}
	}
	return "", 0
}

// logRestart says why the controller's container restarted: its last state and the end of the
// previous container's log (the lines it exited with).
func (c *controller) logRestart(ctx context.Context) {
	pod, err := c.Pod(ctx)
	if err != nil {
		logf("the controller restarted during the burst: %v", err)
		return
	}
	name := pod.Spec.Containers[c.Container].Name
	state := "unknown"
	for _, s := range pod.Status.ContainerStatuses {
		if t := s.LastTerminationState.Terminated; s.Name == name && t != nil {
			state = fmt.Sprintf("exit code %d, %s, at %s", t.ExitCode, t.Reason, t.FinishedAt.UTC().Format(time.TimeOnly))
		}
	}
	tail := int64(8)
	raw, err := c.Kube.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: name, Previous: true, TailLines: &tail}).DoRaw(ctx)
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
		if s.Name == pod.Spec.Containers[c.Container].Name && s.State.Running != nil {
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
