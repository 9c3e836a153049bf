//go:build security

package security

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
)

// TestJobRunsUnderGVisorKernel: the job's kernel is gVisor's, not the node's: /proc/version
// names gVisor's kernel, which differs from the node's, and the kernel log is gVisor's boot log.
func TestJobRunsUnderGVisorKernel(t *testing.T) {
	t.Parallel()
	r := clusterjobs.Connect(t).NewRunner(t, "sec-kernel", "")
	j := prepared(t, r, clusterjobs.JobSpec{})
	out := j.MustRun(t, "cat /proc/version\ndmesg | head -n 1\n").Stdout
	host, err := os.ReadFile("/proc/version")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("want /proc/version and the first kernel log line, got:\n%s", out)
	}
	if !strings.Contains(lines[0], "gvisor") || lines[0] == strings.TrimSpace(string(host)) {
		t.Errorf("/proc/version in the job is %q; want gVisor's kernel, not the node's %q", lines[0], strings.TrimSpace(string(host)))
	}
	if !strings.HasSuffix(lines[1], "Starting gVisor...") {
		t.Errorf("the job's kernel log starts with %q, not gVisor's boot message", lines[1])
	}
}

// TestPoolWithoutGVisorIsRefused: a pool whose template runs pods without gVisor (no
// runtimeClassName: the node's runc; or a RuntimeClass with the runc handler) is refused by
// prepare before any script runs: prepare exits BUILD_FAILURE (the runner must not retry) with
// one line naming the pod's RuntimeClass, nothing of ours is in the pod, and cleanup removes
// the claim.
func TestPoolWithoutGVisorIsRefused(t *testing.T) {
	t.Parallel()
	c := clusterjobs.Connect(t)
	suffix := strconv.Itoa(os.Getpid())
	runc := &nodev1.RuntimeClass{
		ObjectMeta: metav1.ObjectMeta{Name: "sec-runc-" + suffix, Labels: map[string]string{suiteLabel: "true"}},
		Handler:    "runc",
	}
	ctx := context.Background()
	if _, err := c.Admin.Kube.NodeV1().RuntimeClasses().Create(ctx, runc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Admin.Kube.NodeV1().RuntimeClasses().Delete(context.Background(), runc.Name, metav1.DeleteOptions{})
	})

	for _, tc := range []struct {
		name, runtimeClass, shown string
	}{
		{"no-runtimeclass", "", "runtimeClassName is none"},
		{"runc-runtimeclass", runc.Name, "runtimeClassName is " + runc.Name},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := "sec-" + tc.name + "-" + suffix
			createPool(t, c, pool, tc.runtimeClass)
			r := c.NewRunner(t, "sec-"+tc.name, "", clusterjobs.Pool{Name: pool, Images: []string{localcluster.CIImage}})
			j := r.NewJob(t, clusterjobs.JobSpec{})
			res := j.PrepareRefused(t)
			if res.ExitCode != clusterjobs.BuildFailure {
				t.Errorf("prepare exited %d, want BUILD_FAILURE (%d): a refused pool is not retried\n%s", res.ExitCode, clusterjobs.BuildFailure, res.Output())
			}
			errLines := regexp.MustCompile(`(?m)^.*ERROR.*$`).FindAllString(res.Output(), -1)
			if len(errLines) != 1 || !strings.Contains(errLines[0], tc.shown) || !strings.Contains(errLines[0], "refusing pod") {
				t.Errorf("prepare's error is not one line naming the RuntimeClass (%q):\n%s", tc.shown, res.Output())
			} else {
				t.Logf("prepare refused the pool: %s", errLines[0])
			}
			if j.Pod == "" {
				t.Fatal("the claim got no pod: the refusal was not about the pod's RuntimeClass")
			}
			// The pod is there and reachable by an admin: whatever prepare would have put in it
			// would be visible.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			out, err := c.Exec(ctx, j.Pod, "sh", "-c", "echo control-ok; ls -a "+wire.BaseDir+" 2>&1; ls -a /tmp")
			if !strings.Contains(out, "control-ok") {
				t.Fatalf("admin exec into the refused pod %s failed: %v %s", j.Pod, err, out)
			}
			if !strings.Contains(out, "No such file") {
				t.Errorf("the refused pod %s has our directory %s: prepare put something in it:\n%s", j.Pod, wire.BaseDir, out)
			}
		})
	}
}

// suiteLabel marks every object the suite creates itself.
const suiteLabel = "sandbox-executor.test/security-suite"

var (
	templatesGVR = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxtemplates"}
	poolsGVR     = schema.GroupVersionResource{Group: "extensions.agents.x-k8s.io", Version: "v1beta1", Resource: "sandboxwarmpools"}
)

// createPool makes a SandboxTemplate and a one-pod SandboxWarmPool named name, whose pods run
// the CI image under runtimeClass ("": the node's default runtime), and deletes both at the end.
func createPool(t *testing.T, c *clusterjobs.Cluster, name, runtimeClass string) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(clusterjobs.RESTConfig(t, c.AdminKubeconfig()))
	if err != nil {
		t.Fatal(err)
	}
	spec := map[string]any{
		"automountServiceAccountToken":  false,
		"enableServiceLinks":            false,
		"terminationGracePeriodSeconds": int64(1),
		"containers": []any{map[string]any{
			"name": "job", "image": localcluster.CIImage, "imagePullPolicy": "Never", "command": []any{"sleep", "infinity"},
			"securityContext": map[string]any{"allowPrivilegeEscalation": false},
		}},
	}
	if runtimeClass != "" {
		spec["runtimeClassName"] = runtimeClass
	}
	labels := map[string]any{suiteLabel: "true"}
	template := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate",
		"metadata": map[string]any{"name": name, "namespace": clusterjobs.Namespace, "labels": labels},
		"spec": map[string]any{
			"envVarsInjectionPolicy": "Disallowed", "networkPolicyManagement": "Managed",
			"networkPolicy": map[string]any{"ingress": []any{}, "egress": []any{}},
			"podTemplate":   map[string]any{"spec": spec},
		},
	}}
	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
		"metadata": map[string]any{"name": name, "namespace": clusterjobs.Namespace, "labels": labels},
		"spec":     map[string]any{"replicas": int64(1), "sandboxTemplateRef": map[string]any{"name": name}},
	}}
	ctx := context.Background()
	for _, o := range []struct {
		gvr schema.GroupVersionResource
		obj *unstructured.Unstructured
	}{{templatesGVR, template}, {poolsGVR, pool}} {
		if _, err := dyn.Resource(o.gvr).Namespace(clusterjobs.Namespace).Create(ctx, o.obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		gvr := o.gvr
		t.Cleanup(func() {
			if err := dyn.Resource(gvr).Namespace(clusterjobs.Namespace).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
				t.Errorf("deleting %s %s: %v", gvr.Resource, name, err)
			}
		})
	}
	// Until the controller has a sandbox of the pool Ready, its cache may not have the pool yet,
	// and a claim made then is refused as WarmPoolNotFound: the test is about a warm pool's pod.
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		got, err := c.Admin.Extensions.ExtensionsV1beta1().SandboxWarmPools(clusterjobs.Namespace).Get(ctx, name, metav1.GetOptions{})
		return err == nil && got.Status.ReadyReplicas >= 1, nil
	}); err != nil {
		t.Fatalf("pool %s: no Ready sandbox after 3 minutes", name)
	}
}
