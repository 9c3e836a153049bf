package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestParseSettingRefusesWhatCannotReplaceAFlag(t *testing.T) {
	got, err := parseSetting(" --sandbox-claim-concurrent-workers=200  --disable-claim-events ")
	if err != nil || !slices.Equal(got, []string{"--sandbox-claim-concurrent-workers=200", "--disable-claim-events"}) {
		t.Fatalf("parseSetting = %q, %v", got, err)
	}
	if got, err := parseSetting(""); err != nil || len(got) != 0 {
		t.Fatalf("an empty setting is the args as found, got %q, %v", got, err)
	}
	for _, bad := range []string{"200", "-kube-api-qps=5", "--=5", "---x"} {
		_, err := parseSetting("--extensions " + bad)
		if err == nil || !strings.Contains(err.Error(), bad) || strings.Contains(err.Error(), "\n") {
			t.Errorf("parseSetting(%q): want a one-line error naming it, got %v", bad, err)
		}
	}
}

func TestMergeArgsReplacesTheSameFlagWhateverItsDashes(t *testing.T) {
	original := []string{"--leader-elect=true", "-kube-api-qps=10", "--extensions", "--sandbox-concurrent-workers=100"}
	got := mergeArgs(original, []string{"--kube-api-qps=50", "--sandbox-concurrent-workers=400", "--api-connections=4"})
	want := []string{"--leader-elect=true", "--extensions", "--kube-api-qps=50", "--sandbox-concurrent-workers=400", "--api-connections=4"}
	if !slices.Equal(got, want) {
		t.Fatalf("mergeArgs = %q, want %q", got, want)
	}
	if !slices.Equal(original, []string{"--leader-elect=true", "-kube-api-qps=10", "--extensions", "--sandbox-concurrent-workers=100"}) {
		t.Fatalf("mergeArgs changed the original args: %q", original)
	}
}

func TestLeaderElectionFollowsTheLastFlag(t *testing.T) {
	for args, want := range map[string]bool{
		"--extensions":                                     true,
		"--leader-elect=true --extensions":                 true,
		"--leader-elect=true --leader-elect=false":         false,
		"-leader-elect=false":                              false,
		"--leader-elect=false --extensions --leader-elect": true,
	} {
		if got := leaderElection(strings.Fields(args)); got != want {
			t.Errorf("leaderElection(%s) = %v, want %v", args, got, want)
		}
	}
}

func TestRolledOutWaitsForEveryOldPodToGo(t *testing.T) {
	one := int32(1)
	d := func(gen, observed int64, replicas, updated, available, terminating int32) *appsv1.Deployment {
		return &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Generation: gen},
			Spec:       appsv1.DeploymentSpec{Replicas: &one},
			Status: appsv1.DeploymentStatus{ObservedGeneration: observed, Replicas: replicas, UpdatedReplicas: updated,
				AvailableReplicas: available, TerminatingReplicas: &terminating},
		}
	}
	for name, c := range map[string]struct {
		d    *appsv1.Deployment
		want bool
	}{
		"not yet observed":       {d(3, 2, 1, 1, 1, 0), false},
		"new pod not available":  {d(3, 3, 2, 1, 1, 0), false},
		"old pod still running":  {d(3, 3, 2, 1, 2, 0), false},
		"old pod terminating":    {d(3, 3, 1, 1, 1, 1), false},
		"done":                   {d(3, 3, 1, 1, 1, 0), true},
		"new pod not ready, yet": {d(3, 3, 1, 1, 0, 0), false},
	} {
		got, err := rolledOut(c.d)
		if err != nil || got != c.want {
			t.Errorf("%s: rolledOut = %v, %v; want %v", name, got, err, c.want)
		}
	}
	stuck := d(3, 3, 2, 1, 1, 0)
	stuck.Status.Conditions = []appsv1.DeploymentCondition{{Type: appsv1.DeploymentProgressing, Reason: "ProgressDeadlineExceeded", Message: `ReplicaSet "x" has timed out progressing.`}}
	if _, err := rolledOut(stuck); err == nil || !strings.Contains(err.Error(), "timed out progressing") {
		t.Fatalf("a Deployment past its progress deadline: want its message as the error, got %v", err)
	}
}

func TestPIDInCgroupFindsTheContainersFirstProcess(t *testing.T) {
	proc := t.TempDir()
	id := "24176d9bf0052ef028e8b0aae67a5fa12d5238d8147fd4e2959534b8d0a44196"
	for pid, cgroup := range map[string]string{
		"7":    "4:cpu,cpuacct:/kubepods/besteffort/pod1/other\n",
		"1200": "4:cpu,cpuacct:/kubepods/besteffort/podcd71/" + id + "\n",
		"950":  "4:cpu,cpuacct:/kubepods/besteffort/podcd71/" + id + "\n",
		"self": "4:cpu,cpuacct:/kubepods/besteffort/podcd71/" + id + "\n",
	} {
		if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proc, pid, "cgroup"), []byte(cgroup), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := pidInCgroup(proc, id); err != nil || got != "950" {
		t.Fatalf("pidInCgroup = %q, %v; want 950", got, err)
	}
	if _, err := pidInCgroup(proc, "0123456789abcdef"); err == nil || !strings.Contains(err.Error(), "0123456789ab") {
		t.Fatalf("a container with no process here: want an error naming it, got %v", err)
	}
}

// fakeController is the released controller Deployment with one running pod that holds the
// leader lease, its status already rolled out: the fake clientset runs no Deployment controller,
// so every update is "rolled out" at once and what the test checks is what the bench writes.
func fakeController(annotations map[string]string) *fake.Clientset {
	one := int32(1)
	labels := map[string]string{"app": "agent-sandbox-controller"}
	return fake.NewClientset(
		&appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "agent-sandbox-controller", Namespace: "agent-sandbox-system", UID: "deployment-uid", Annotations: annotations},
			Spec: appsv1.DeploymentSpec{
				Replicas: &one,
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
					ServiceAccountName: "agent-sandbox-controller",
					Containers:         []corev1.Container{{Name: "agent-sandbox-controller", Args: []string{"--leader-elect=true", "--extensions"}}},
				}},
			},
			Status: appsv1.DeploymentStatus{Replicas: 1, UpdatedReplicas: 1, AvailableReplicas: 1},
		},
		&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "agent-sandbox-controller-abc", Namespace: "agent-sandbox-system", Labels: labels},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning},
		},
		replicaSet("agent-sandbox-controller-as-found", 0, labels),
		&coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: "a3317529.agent-sandbox.x-k8s.io", Namespace: "agent-sandbox-system"},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: new("agent-sandbox-controller-abc_0f1e")},
		},
	)
}

// replicaSet is one of the controller Deployment's ReplicaSets.
func replicaSet(name string, replicas int32, labels map[string]string) *appsv1.ReplicaSet {
	return &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "agent-sandbox-system", Labels: labels, OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "apps/v1", Kind: "Deployment", Name: "agent-sandbox-controller", UID: "deployment-uid", Controller: new(true),
		}}},
		Spec: appsv1.ReplicaSetSpec{Replicas: &replicas},
	}
}

func deployment(t *testing.T, kube *fake.Clientset) *appsv1.Deployment {
	t.Helper()
	d, err := kube.AppsV1().Deployments("agent-sandbox-system").Get(context.Background(), "agent-sandbox-controller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestApplyRecordsTheOriginalArgsAndRestorePutsThemBack(t *testing.T) {
	ctx := context.Background()
	kube := fakeController(nil)
	c, err := findController(ctx, kube, "agent-sandbox-system", "agent-sandbox-controller")
	if err != nil {
		t.Fatal(err)
	}
	if c.serviceAccount != "agent-sandbox-controller" {
		t.Fatalf("service account %q", c.serviceAccount)
	}
	if err := c.apply(ctx, []string{"--sandbox-claim-concurrent-workers=200", "--leader-elect=true"}); err != nil {
		t.Fatal(err)
	}
	d := deployment(t, kube)
	if got := d.Spec.Template.Spec.Containers[0].Args; !slices.Equal(got, []string{"--extensions", "--sandbox-claim-concurrent-workers=200", "--leader-elect=true"}) {
		t.Fatalf("applied args %q", got)
	}
	if got := d.Annotations[originalArgsAnnotation]; got != `["--leader-elect=true","--extensions"]` {
		t.Fatalf("recorded original args %q", got)
	}

	// A setting after another replaces it: the flags of the first are gone.
	if err := c.apply(ctx, []string{"--disable-claim-events"}); err != nil {
		t.Fatal(err)
	}
	if got := deployment(t, kube).Spec.Template.Spec.Containers[0].Args; !slices.Equal(got, []string{"--leader-elect=true", "--extensions", "--disable-claim-events"}) {
		t.Fatalf("second setting's args %q", got)
	}
	// The args as found, as a setting after another, are rolled back out.
	if err := c.apply(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if got := deployment(t, kube).Spec.Template.Spec.Containers[0].Args; !slices.Equal(got, []string{"--leader-elect=true", "--extensions"}) {
		t.Fatalf("the args as found after a setting: %q", got)
	}
	if err := c.apply(ctx, []string{"--sandbox-claim-concurrent-workers=200"}); err != nil {
		t.Fatal(err)
	}
	// What the Deployment controller would leave of the settings' rollouts: their ReplicaSets.
	labels := map[string]string{"app": "agent-sandbox-controller"}
	for _, rs := range []*appsv1.ReplicaSet{replicaSet("agent-sandbox-controller-setting", 0, labels), replicaSet("agent-sandbox-controller-current", 1, labels)} {
		if _, err := kube.AppsV1().ReplicaSets("agent-sandbox-system").Create(ctx, rs, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// An interrupt cancels the run's context; restoring must still happen.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := c.restore(cancelled); err != nil {
		t.Fatal(err)
	}
	d = deployment(t, kube)
	if got := d.Spec.Template.Spec.Containers[0].Args; !slices.Equal(got, []string{"--leader-elect=true", "--extensions"}) {
		t.Fatalf("restored args %q", got)
	}
	if _, ok := d.Annotations[originalArgsAnnotation]; ok {
		t.Fatal("the record of the original args is left on the Deployment")
	}
	sets, err := kube.AppsV1().ReplicaSets("agent-sandbox-system").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, rs := range sets.Items {
		names = append(names, rs.Name)
	}
	slices.Sort(names)
	if want := []string{"agent-sandbox-controller-as-found", "agent-sandbox-controller-current"}; !slices.Equal(names, want) {
		t.Fatalf("ReplicaSets after restoring %q, want %q (the setting's, scaled to 0, deleted)", names, want)
	}
	// Restoring twice (the run's normal end after an earlier restore) writes nothing.
	before := len(kube.Actions())
	if err := c.restore(ctx); err != nil || len(kube.Actions()) != before {
		t.Fatalf("a second restore: %v, %d more API calls", err, len(kube.Actions())-before)
	}
}

func TestFindControllerUndoesAnAbortedRun(t *testing.T) {
	kube := fakeController(map[string]string{originalArgsAnnotation: `["--leader-elect=true","--extensions","--webhook-port=9443"]`})
	c, err := findController(context.Background(), kube, "agent-sandbox-system", "agent-sandbox-controller")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"--leader-elect=true", "--extensions", "--webhook-port=9443"}
	d := deployment(t, kube)
	if got := d.Spec.Template.Spec.Containers[0].Args; !slices.Equal(got, want) || !slices.Equal(c.original, want) {
		t.Fatalf("args after finding the controller %q, original %q; want the recorded %q", got, c.original, want)
	}
	if _, ok := d.Annotations[originalArgsAnnotation]; ok {
		t.Fatal("the record of the original args is left on the Deployment")
	}
}

func TestFindControllerNamesAMissingDeployment(t *testing.T) {
	_, err := findController(context.Background(), fake.NewClientset(), "agent-sandbox-system", "agent-sandbox-controller")
	if err == nil || !strings.Contains(err.Error(), "agent-sandbox-system/agent-sandbox-controller") {
		t.Fatalf("want an error naming the Deployment, got %v", err)
	}
}
