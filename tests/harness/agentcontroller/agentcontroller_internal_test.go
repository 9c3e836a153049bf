package agentcontroller

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

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

// fakeController is the released controller Deployment with one running pod that holds the
// leader lease, its status already rolled out: the fake clientset runs no Deployment controller,
// so every update is "rolled out" at once and what the test checks is what a bench writes.
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
	c, err := Find(ctx, kube, Namespace, Name, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if c.ServiceAccount != "agent-sandbox-controller" {
		t.Fatalf("service account %q", c.ServiceAccount)
	}
	if err := c.Apply(ctx, []string{"--sandbox-claim-concurrent-workers=200", "--leader-elect=true"}); err != nil {
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
	if err := c.Apply(ctx, []string{"--disable-claim-events"}); err != nil {
		t.Fatal(err)
	}
	if got := deployment(t, kube).Spec.Template.Spec.Containers[0].Args; !slices.Equal(got, []string{"--leader-elect=true", "--extensions", "--disable-claim-events"}) {
		t.Fatalf("second setting's args %q", got)
	}
	// The args as found, as a setting after another, are rolled back out.
	if err := c.Apply(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if got := deployment(t, kube).Spec.Template.Spec.Containers[0].Args; !slices.Equal(got, []string{"--leader-elect=true", "--extensions"}) {
		t.Fatalf("the args as found after a setting: %q", got)
	}
	if err := c.Apply(ctx, []string{"--sandbox-claim-concurrent-workers=200"}); err != nil {
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
	if err := c.Restore(cancelled); err != nil {
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
	if err := c.Restore(ctx); err != nil || len(kube.Actions()) != before {
		t.Fatalf("a second restore: %v, %d more API calls", err, len(kube.Actions())-before)
	}
}

func TestFindUndoesAnAbortedRun(t *testing.T) {
	kube := fakeController(map[string]string{originalArgsAnnotation: `["--leader-elect=true","--extensions","--webhook-port=9443"]`})
	c, err := Find(context.Background(), kube, Namespace, Name, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"--leader-elect=true", "--extensions", "--webhook-port=9443"}
	d := deployment(t, kube)
	if got := d.Spec.Template.Spec.Containers[0].Args; !slices.Equal(got, want) || !slices.Equal(c.Original, want) {
		t.Fatalf("args after finding the controller %q, original %q; want the recorded %q", got, c.Original, want)
	}
	if _, ok := d.Annotations[originalArgsAnnotation]; ok {
		t.Fatal("the record of the original args is left on the Deployment")
	}
}

func TestFindNamesAMissingDeployment(t *testing.T) {
	_, err := Find(context.Background(), fake.NewClientset(), Namespace, Name, t.Logf)
	if err == nil || !strings.Contains(err.Error(), "agent-sandbox-system/agent-sandbox-controller") {
		t.Fatalf("want an error naming the Deployment, got %v", err)
	}
}

// webhookEndpoints is the webhook Service and its EndpointSlice listing pods, each ready or not.
func webhookEndpoints(pods map[string]bool) []runtime.Object {
	slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: WebhookService + "-x", Namespace: Namespace,
		Labels: map[string]string{discoveryv1.LabelServiceName: WebhookService}}}
	for pod, ready := range pods {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.0.0.1"},
			Conditions: discoveryv1.EndpointConditions{Ready: new(ready)}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: pod}})
	}
	return []runtime.Object{&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: WebhookService, Namespace: Namespace}}, slice}
}

func TestApplyWaitsUntilTheNewPodAloneServesTheWebhook(t *testing.T) {
	serving := fakeController(nil)
	for _, o := range webhookEndpoints(map[string]bool{"agent-sandbox-controller-abc": true}) {
		if err := serving.Tracker().Add(o); err != nil {
			t.Fatal(err)
		}
	}
	c, err := Find(context.Background(), serving, Namespace, Name, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Apply(context.Background(), []string{"--sandbox-warm-pool-replenish-delay=3s"}); err != nil {
		t.Fatalf("the new pod serves the webhook alone: %v", err)
	}

	for name, pods := range map[string]map[string]bool{
		"the old pod still an endpoint": {"agent-sandbox-controller-abc": true, "agent-sandbox-controller-old": true},
		"the new pod not ready":         {"agent-sandbox-controller-abc": false},
	} {
		kube := fakeController(nil)
		for _, o := range webhookEndpoints(pods) {
			if err := kube.Tracker().Add(o); err != nil {
				t.Fatal(err)
			}
		}
		c, err := Find(context.Background(), kube, Namespace, Name, t.Logf)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err = c.Apply(ctx, []string{"--sandbox-warm-pool-replenish-delay=3s"})
		cancel()
		if err == nil || !strings.Contains(err.Error(), WebhookService) {
			t.Errorf("%s: want an error naming the webhook Service, got %v", name, err)
		}
	}
}
