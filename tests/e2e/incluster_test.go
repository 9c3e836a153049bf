//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/tests/clustertest"
	"github.com/sandbox-executor/sandbox-executor/tests/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/testutil"
	"github.com/sandbox-executor/sandbox-executor/tools/duoflow"
)

// The in-cluster install, as a user makes it: the chart (deploy/chart/sandbox-executor) with the
// project's images (make images), the runner (gitlab-runner 17.9 in the runner image) in a pod
// with the ServiceAccount's credentials, GitLab reached by a cluster DNS name.

const (
	inClusterRelease = "duo"
	inClusterRunner  = "incluster-runner"
	// inClusterTimeout bounds one step: an install until a job is handed out (image start,
	// registration), a job, a cleanup.
	inClusterTimeout = 5 * time.Minute
)

// chartImages is dist/images/images.json as tools/images writes it (make images).
type chartImages struct {
	Tag    string `json:"tag"`
	Images []struct {
		Name string `json:"name"`
		Ref  string `json:"ref"`
	} `json:"images"`
}

// builtImages reads what make images built and imported; the runner image must be among them.
func builtImages(t *testing.T, root string) chartImages {
	t.Helper()
	path := filepath.Join(root, "dist", "images", "images.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v: run `make images` first (it builds the images and imports them into the local cluster)", err)
	}
	var m chartImages
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for _, img := range m.Images {
		if img.Name == "sandbox-executor-runner" {
			return m
		}
	}
	t.Fatalf("%s has no sandbox-executor-runner image (tools/images skips it without the runner binaries)", path)
	return m
}

// run runs a command of the install (helm, kubectl) and returns its output, failing the test
// with that output if it fails.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
	return string(out)
}

// helmBinary is the pinned helm the Makefile installs (make helm).
func helmBinary(t *testing.T, root string) string {
	t.Helper()
	return strings.TrimSpace(run(t, "make", "-s", "--no-print-directory", "-C", root, "helm-path"))
}

// inClusterValues are the chart values of the test's release: the namespace made beforehand
// (helm cannot install into a namespace its own chart creates), its own RuntimeClass (a
// cluster-scoped object uninstall must remove), GitLab at a cluster DNS name, the job pods
// allowed to reach the instance's address, the runner on, gc on a schedule that never fires
// (the test triggers it).
func inClusterValues(tag, gitlabURL, instanceIP string) string {
	return fmt.Sprintf(`namespace:
  create: false
images:
  repository: sandbox-executor.local
  tag: %[1]q
  pullPolicy: Never
runtimeClass:
  create: true
  handler: runsc
gitlab:
  url: %[2]s
  cidrs: ["%[3]s/32"]
  ports: [80]
jobDefaults:
  fence:
    deny: ["10.99.0.2:80"]
    allow: ["%[3]s:80"]
  resources:
    requests: {cpu: 50m, memory: 256Mi, ephemeral-storage: 1Gi}
    limits: {cpu: "2", memory: 2Gi, ephemeral-storage: 4Gi}
templates:
  - name: duo-gvisor
    image: %[4]s
    egress: direct
pools:
  - name: duo-default
    template: duo-gvisor
    replicas: 2
    images: ["sandbox-executor.local/ci:*"]
executor:
  runnerName: %[5]s
  defaultPool: duo-default
  stageTransport: network
runner:
  enabled: true
  secret: gitlab-runner-token
  checkInterval: 1
  resources:
    requests: {cpu: 50m, memory: 64Mi}
    limits: {cpu: "1", memory: 512Mi}
gc:
  enabled: true
  schedule: "0 0 1 1 *"
`, tag, gitlabURL, instanceIP, ciImage, inClusterRunner)
}

// TestInClusterInstall installs the chart into a namespace of its own, where the runner pod
// registers with the fake GitLab by a cluster DNS name and runs a Duo-shaped job, a failing job
// and a canceled one in gVisor pods over the pod network; then gc, started from its CronJob,
// reaps an expired claim; then helm uninstall leaves nothing behind.
func TestInClusterInstall(t *testing.T) {
	c := clustertest.Connect(t)
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	images := builtImages(t, root)
	helm := helmBinary(t, root)
	kubectl := filepath.Join(c.Dir, "bin", "kubectl")
	kubeconfig := "--kubeconfig=" + c.AdminKubeconfig()
	ctx := context.Background()
	suffix := strconv.Itoa(os.Getpid())
	ns := "sbx-incluster-" + suffix
	gitlabNS := "sbx-incluster-gitlab-" + suffix

	inst, err := duoflow.NewInstance()
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close()
	base, err := inst.CreateProject()
	if err != nil {
		t.Fatal(err)
	}
	// The instance by name from the pod network: a Service without selector whose endpoint is
	// the instance's address, as for any GitLab outside the cluster.
	gitlabURL := exposeInstance(t, c, gitlabNS, inst.Host)
	t.Logf("GitLab instance %s as %s", inst.GitLab.URL(), gitlabURL)

	valuesFile := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(valuesFile, []byte(inClusterValues(images.Tag, gitlabURL, inst.Host)), 0o600); err != nil {
		t.Fatal(err)
	}
	chart := filepath.Join(root, "deploy", "chart", "sandbox-executor")
	uninstalled := false
	t.Cleanup(func() {
		if !uninstalled {
			_ = exec.Command(helm, "uninstall", inClusterRelease, "-n", ns, "--wait", "--timeout", "3m", kubeconfig).Run()
		}
		_ = c.Admin.Kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	// The release namespace, made as an operator would, with the Pod Security labels the chart
	// would give it.
	if _, err := c.Admin.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "baseline", "pod-security.kubernetes.io/warn": "restricted"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Log(run(t, helm, "install", inClusterRelease, chart, "-n", ns, "-f", valuesFile, kubeconfig))
	// The runner token, where the runner chart keeps it (Secret key runner-token); the runner
	// pod waits for it.
	if _, err := c.Admin.Kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "gitlab-runner-token"},
		StringData: map[string]string{"runner-token": inst.GitLab.RunnerToken()},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	runnerLogs := func() string {
		out, _ := exec.Command(kubectl, kubeconfig, "-n", ns, "logs", "deploy/"+inClusterRelease+"-sandbox-executor-runner", "--tail=80").CombinedOutput()
		return string(out)
	}
	wait := func(id int64) fakegitlab.Result {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, inClusterTimeout)
		defer cancel()
		res, err := inst.GitLab.Wait(ctx, id)
		if err != nil {
			t.Fatalf("job %d: %v\ntrace so far:\n%s\nrunner pod log:\n%s", id, err, res.Trace, runnerLogs())
		}
		return res
	}

	// A Duo-shaped job: clone, npm install from the instance, tests, a push back, an artifact.
	duo := inst.Job(base, ciImage)
	inst.GitLab.Enqueue(duo)
	res := wait(duo.ID)
	if res.State != fakegitlab.StateSuccess {
		t.Fatalf("Duo job %d: %s (%s)\n%s\nrunner pod log:\n%s", duo.ID, res.State, res.FailureReason, res.Trace, runnerLogs())
	}
	mustContain(t, "Duo job trace", res.Trace,
		"Sandbox ready: pool duo-default", "pod "+ns+"/", "runtime "+ns+"-"+inClusterRelease+"-sandbox-executor-gvisor", "stages over pod network",
		"tests passed: welcome, farewell", "Uploading artifacts", "egress to the instance: allowed", "egress outside: blocked")
	branch := duoflow.Branch(duo.ID)
	assertArtifact(t, res, "pushed "+assertPushed(t, inst, branch, base)+" on "+branch)
	if res.Runner.Version != "17.9.0" {
		t.Errorf("the job ran on gitlab-runner %q, want 17.9.0", res.Runner.Version)
	}
	for _, v := range duo.Variables {
		if v.Masked && strings.Contains(res.Trace, v.Value) {
			t.Errorf("the value of %s appears in the trace", v.Key)
		}
	}
	waitClaimsGone(t, c, ns, kube.LabelJobID+"="+strconv.FormatInt(duo.ID, 10))
	t.Logf("Duo job %d: %s in %s; %s", duo.ID, res.State, res.Duration().Round(time.Millisecond), sandboxReady.FindString(res.Trace))

	// A failing job: the script's exit code reaches GitLab as a script failure.
	failing := inst.GitLab.NewJob(fakegitlab.JobSpec{Image: ciImage, GitStrategy: "none", Script: []string{"echo about to fail", "exit 3"}})
	inst.GitLab.Enqueue(failing)
	res = wait(failing.ID)
	if res.State != fakegitlab.StateFailed || res.FailureReason != "script_failure" {
		t.Errorf("failing job %d: %s (%s), want failed (script_failure)\n%s", failing.ID, res.State, res.FailureReason, res.Trace)
	}
	mustContain(t, "failing job trace", res.Trace, "about to fail", "ERROR: Job failed: exit status 3")
	waitClaimsGone(t, c, ns, kube.LabelJobID+"="+strconv.FormatInt(failing.ID, 10))

	// A canceled job: GitLab cancels it while its stage runs; the runner stops it and cleanup
	// releases the sandbox.
	canceled := inst.GitLab.NewJob(fakegitlab.JobSpec{Image: ciImage, GitStrategy: "none", Script: []string{"echo waiting-for-cancel", "sleep 600", "echo NOT-CANCELED"}})
	inst.GitLab.Enqueue(canceled)
	{
		ctx, cancel := context.WithTimeout(ctx, inClusterTimeout)
		if res, err := inst.GitLab.WaitForTrace(ctx, canceled.ID, "waiting-for-cancel"); err != nil {
			cancel()
			t.Fatalf("job %d never started its stage: %v\n%s\nrunner pod log:\n%s", canceled.ID, err, res.Trace, runnerLogs())
		}
		cancel()
	}
	if err := inst.GitLab.Cancel(canceled.ID); err != nil {
		t.Fatal(err)
	}
	res = wait(canceled.ID)
	if res.State != fakegitlab.StateCanceled || strings.Contains(res.Trace, "NOT-CANCELED") {
		t.Errorf("canceled job %d: %s, want canceled before the stage ended\n%s", canceled.ID, res.State, res.Trace)
	}
	waitClaimsGone(t, c, ns, kube.LabelJobID+"="+strconv.FormatInt(canceled.ID, 10))

	// gc from its CronJob: an expired claim of this runner that agent-sandbox keeps (policy
	// Retain), as one left by a runner that died, is deleted; gc runs as its own ServiceAccount.
	expired := expiredClaim(t, c, ns)
	gcJob := "gc-now-" + suffix
	run(t, kubectl, kubeconfig, "-n", ns, "create", "job", gcJob, "--from=cronjob/"+inClusterRelease+"-sandbox-executor-gc")
	run(t, kubectl, kubeconfig, "-n", ns, "wait", "--for=condition=complete", "--timeout=3m", "job/"+gcJob)
	gcLog := run(t, kubectl, kubeconfig, "-n", ns, "logs", "job/"+gcJob)
	mustContain(t, "gc log", gcLog, "deleted "+ns+"/"+expired+" ", "shutdownTime passed", fmt.Sprintf("of runner %q deleted", inClusterRunner))
	waitClaimsGone(t, c, ns, "metadata.name="+expired)
	t.Logf("gc: %s", strings.TrimSpace(gcLog))

	// Uninstall: nothing of the release is left, in its namespace or cluster-wide.
	run(t, helm, "uninstall", inClusterRelease, "-n", ns, "--wait", "--timeout", "3m", kubeconfig)
	uninstalled = true
	assertNothingLeft(t, c, kubectl, kubeconfig, ns)
}

// exposeInstance makes the instance at ip (port 80) reachable as gitlab.NS.svc.cluster.local:
// a Service without selector and an EndpointSlice with the address. Returns the URL.
func exposeInstance(t *testing.T, c *clustertest.Cluster, ns, ip string) string {
	t.Helper()
	ctx := context.Background()
	if _, err := c.Admin.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Admin.Kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	})
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "gitlab"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
	if _, err := c.Admin.Kube.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "gitlab-instance", Labels: map[string]string{
			discoveryv1.LabelServiceName: "gitlab", discoveryv1.LabelManagedBy: "sandbox-executor-e2e"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(80)), Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}
	if _, err := c.Admin.Kube.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return "http://gitlab." + ns + ".svc.cluster.local"
}

// expiredClaim creates a claim labelled as the runner's, whose shutdownTime has passed, with
// policy Retain so that agent-sandbox keeps it: only gc removes it. Returns its name.
func expiredClaim(t *testing.T, c *clustertest.Cluster, ns string) string {
	t.Helper()
	name := "expired-" + strconv.FormatInt(fakegitlab.NextJobID(), 10)
	claim := &extv1beta1.SandboxClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			kube.LabelManagedBy: kube.ManagedByValue, kube.LabelRunner: kube.RunnerLabel(inClusterRunner), kube.LabelJobID: "0"}},
		Spec: extv1beta1.SandboxClaimSpec{
			WarmPoolRef: extv1beta1.SandboxWarmPoolRef{Name: "duo-default"},
			Lifecycle: &extv1beta1.Lifecycle{ShutdownPolicy: extv1beta1.ShutdownPolicyRetain,
				ShutdownTime: ptr.To(metav1.NewTime(time.Now().Add(-time.Hour)))},
		},
	}
	if _, err := c.Admin.Extensions.ExtensionsV1beta1().SandboxClaims(ns).Create(context.Background(), claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

// waitClaimsGone watches the claims of ns that match selector (a label selector, or
// metadata.name=NAME) until there are none.
func waitClaimsGone(t *testing.T, c *clustertest.Cluster, ns, selector string) {
	t.Helper()
	narrow := func(o *metav1.ListOptions) {
		if name, ok := strings.CutPrefix(selector, "metadata.name="); ok {
			o.FieldSelector = "metadata.name=" + name
		} else {
			o.LabelSelector = selector
		}
	}
	claims := c.Admin.Extensions.ExtensionsV1beta1().SandboxClaims(ns)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			narrow(&o)
			return claims.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			narrow(&o)
			return claims.Watch(ctx, o)
		},
	}
	if left := waitNoneLeft(lw, &extv1beta1.SandboxClaim{}); left != nil {
		t.Fatalf("claims of %s with %s still there after %s: %v", ns, selector, inClusterTimeout, left)
	}
}

// waitNoneLeft watches what lw lists until nothing is left, and returns the names still there
// if that does not happen within inClusterTimeout.
func waitNoneLeft(lw cache.ListerWatcher, obj runtime.Object) []string {
	ctx, cancel := context.WithTimeout(context.Background(), inClusterTimeout)
	defer cancel()
	var store cache.Store
	empty := func() bool { return store != nil && len(store.List()) == 0 }
	_, err := watchtools.UntilWithSync(ctx, lw, obj, func(s cache.Store) (bool, error) {
		store = s
		return empty(), nil
	}, func(watch.Event) (bool, error) { return empty(), nil })
	if err == nil {
		return nil
	}
	names := []string{err.Error()}
	if store != nil {
		names = store.ListKeys()
	}
	return names
}

// assertNothingLeft: after helm uninstall, no object with the release's labels is left in any
// namespace or cluster-wide, and the namespace holds no claim, sandbox or pod.
func assertNothingLeft(t *testing.T, c *clustertest.Cluster, kubectl, kubeconfig, ns string) {
	t.Helper()
	kinds := "all,configmaps,secrets,serviceaccounts,roles,rolebindings,networkpolicies,cronjobs," +
		"sandboxtemplates.extensions.agents.x-k8s.io,sandboxwarmpools.extensions.agents.x-k8s.io," +
		"clusterroles,clusterrolebindings,runtimeclasses,validatingadmissionpolicies,validatingadmissionpolicybindings,namespaces"
	left := run(t, kubectl, kubeconfig, "get", kinds, "-A", "-o", "name",
		"-l", "app.kubernetes.io/instance="+inClusterRelease+",app.kubernetes.io/part-of=sandbox-executor")
	if strings.TrimSpace(left) != "" {
		t.Errorf("objects of release %s left after helm uninstall:\n%s", inClusterRelease, left)
	}
	ctx := context.Background()
	claims, err := c.Admin.Extensions.ExtensionsV1beta1().SandboxClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if claims != nil && len(claims.Items) > 0 {
		t.Errorf("%d claims left in %s after helm uninstall", len(claims.Items), ns)
	}
	sandboxes, err := c.Admin.Sandboxes.AgentsV1beta1().Sandboxes(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(sandboxes.Items) > 0 {
		t.Errorf("%d sandboxes left in %s after helm uninstall", len(sandboxes.Items), ns)
	}
	// Pods go with their sandboxes (garbage collection): watch until none is left.
	pods := c.Admin.Kube.CoreV1().Pods(ns)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return pods.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return pods.Watch(ctx, o)
		},
	}
	if left := waitNoneLeft(lw, &corev1.Pod{}); left != nil {
		t.Errorf("pods left in %s after helm uninstall: %v", ns, left)
	}
}
