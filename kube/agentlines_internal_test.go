package kube

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	sandboxfake "sigs.k8s.io/agent-sandbox/clients/k8s/clientset/versioned/fake"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
)

func runningPod(name, uid, containerID string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(uid)},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "job"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
			Name: "job", ContainerID: containerID, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
		}}},
	}
}

// A line read ahead counts only for the container instance it was read from.
func TestAgentLinesLookupMatchesTheContainerInstance(t *testing.T) {
	a := NewAgentLines(&Clients{}, "ns")
	a.lines["pool-1"] = agentLine{podUID: "uid-1", containerID: "containerd://aaa", line: "identity\n"}
	restarted := runningPod("pool-1", "uid-1", "containerd://bbb")
	terminated := runningPod("pool-1", "uid-1", "containerd://aaa")
	terminated.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{}}
	for name, tc := range map[string]struct {
		pod  *corev1.Pod
		want bool
	}{
		"the same container":       {runningPod("pool-1", "uid-1", "containerd://aaa"), true},
		"another pod of the name":  {runningPod("pool-1", "uid-2", "containerd://aaa"), false},
		"a restarted container":    {restarted, false},
		"a container not running":  {terminated, false},
		"a pod not read ahead":     {runningPod("pool-2", "uid-3", "containerd://ccc"), false},
		"a pod without containers": {&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pool-1", UID: "uid-1"}}, false},
	} {
		line, ok := a.Lookup(tc.pod)
		if ok != tc.want || ok && line != "identity\n" {
			t.Errorf("%s: Lookup = %q, %t; want a hit: %t", name, line, ok, tc.want)
		}
	}
}

// The watch reads the pod of every Ready sandbox (its pod, then its log's head), not of one still
// booting, and forgets a sandbox that is deleted.
func TestAgentLinesReadsReadySandboxesAhead(t *testing.T) {
	kube := kubefake.NewClientset(runningPod("ready-1", "uid-1", "containerd://aaa"), runningPod("booting-1", "uid-2", "containerd://bbb"))
	sandboxes := sandboxfake.NewSimpleClientset()
	events := watch.NewRaceFreeFake()
	sandboxes.PrependWatchReactor("sandboxes", func(k8stesting.Action) (bool, watch.Interface, error) { return true, events, nil })
	a := NewAgentLines(&Clients{Kube: kube, Sandboxes: sandboxes}, "ns")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx) }()
	defer func() { cancel(); <-done }()

	sandbox := func(name string, ready metav1.ConditionStatus) *sandboxv1beta1.Sandbox {
		s := &sandboxv1beta1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}}
		s.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: ready}}
		return s
	}
	events.Add(sandbox("booting-1", metav1.ConditionFalse))
	events.Add(sandbox("ready-1", metav1.ConditionTrue))
	// The fake's log is "fake logs", without a line end: read, but no complete line to keep.
	if err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return podReads(kube, "ready-1") == 1 && logReads(kube) == 1, nil
	}); err != nil {
		t.Fatalf("the Ready sandbox's pod and log were not read: %v", kube.Actions())
	}
	if n := podReads(kube, "booting-1"); n != 0 {
		t.Errorf("a booting sandbox's pod was read %d times", n)
	}
	if a.kept() != 0 {
		t.Errorf("%d lines kept from a log without a complete first line", a.kept())
	}
	a.mu.Lock()
	a.lines["ready-1"] = agentLine{podUID: "uid-1", containerID: "containerd://aaa", line: "identity\n"}
	a.mu.Unlock()
	events.Delete(sandbox("ready-1", metav1.ConditionTrue))
	if err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return a.kept() == 0, nil
	}); err != nil {
		t.Error("the line of a deleted sandbox was kept")
	}
}

// podReads counts the gets of pod; logReads, of any pod's log (the fake does not name the pod).
func podReads(kube *kubefake.Clientset, pod string) int {
	n := 0
	for _, action := range kube.Actions() {
		if get, ok := action.(k8stesting.GetAction); ok && action.GetResource().Resource == "pods" && action.GetSubresource() == "" && get.GetName() == pod {
			n++
		}
	}
	return n
}

func logReads(kube *kubefake.Clientset) int {
	n := 0
	for _, action := range kube.Actions() {
		if action.GetVerb() == "get" && action.GetSubresource() == "log" {
			n++
		}
	}
	return n
}

// A sandbox seen adopted is announced to prepare with the address and line read ahead for its
// pod, for the TLS handshake to start while the pod is verified; without a line read ahead (or
// its pod's address), or without the network transport, nothing is announced.
func TestAdoptionAnnouncesTheLineReadAhead(t *testing.T) {
	lines := NewAgentLines(&Clients{}, "ns")
	lines.lines["pool-1"] = agentLine{podUID: "uid-1", containerID: "containerd://aaa", podIP: "10.0.0.5", line: "identity\n"}
	lines.lines["pool-2"] = agentLine{podUID: "uid-2", containerID: "containerd://bbb", line: "identity\n"}
	sandbox := func(name string) *sandboxv1beta1.Sandbox {
		return &sandboxv1beta1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}}
	}
	for name, tc := range map[string]struct {
		lines    *AgentLines
		agentLog bool
		sandbox  string
		want     string
	}{
		"a line read ahead":           {lines, true, "pool-1", "10.0.0.5 identity\n"},
		"a line without its address":  {lines, true, "pool-2", ""},
		"a pod not read ahead":        {lines, true, "pool-3", ""},
		"the exec transport":          {lines, false, "pool-1", ""},
		"no stage server read it all": {nil, true, "pool-1", ""},
	} {
		var got string
		c := &Claimer{clients: &Clients{AgentLines: tc.lines}}
		c.announce(ClaimRequest{AgentLog: tc.agentLog, Ahead: func(ip, line string) { got += ip + " " + line }}, sandbox(tc.sandbox))
		if got != tc.want {
			t.Errorf("%s: announced %q, want %q", name, got, tc.want)
		}
	}
}

// In the stage server the adoption is seen on the namespace's watch that runs already: a claim
// gets the Ready sandbox it controls, whether the adoption came before it asked or after, and
// never another claim's or one not Ready; while nothing is watched, the claim watches itself.
func TestAdoptionSeenOnTheRunningWatch(t *testing.T) {
	sandboxes := sandboxfake.NewSimpleClientset()
	events := watch.NewRaceFreeFake()
	sandboxes.PrependWatchReactor("sandboxes", func(k8stesting.Action) (bool, watch.Interface, error) { return true, events, nil })
	a := NewAgentLines(&Clients{Kube: kubefake.NewClientset(), Sandboxes: sandboxes}, "ns")
	claim := func(uid string) *extv1beta1.SandboxClaim {
		return &extv1beta1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Name: "job-" + uid, Namespace: "ns", UID: types.UID(uid)}}
	}
	if _, _, ok := a.adoption(claim("early")); ok {
		t.Fatal("an adoption was promised before the watch runs")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		_, _, ok := a.adoption(claim("probe"))
		return ok, nil
	}); err != nil {
		t.Fatal("the watch never ran")
	}
	adopted := func(name, claimUID string, ready metav1.ConditionStatus) *sandboxv1beta1.Sandbox {
		s := &sandboxv1beta1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns",
			Labels:          map[string]string{extv1beta1.SandboxIDLabel: claimUID},
			OwnerReferences: []metav1.OwnerReference{{Kind: "SandboxClaim", Name: "job-" + claimUID, UID: types.UID(claimUID), Controller: ptr.To(true)}}}}
		s.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: ready}}
		return s
	}
	// Adopted before the claim asks.
	events.Add(adopted("pool-1", "before", metav1.ConditionTrue))
	var found <-chan *sandboxv1beta1.Sandbox
	if err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		f, _, _ := a.adoption(claim("before"))
		found = f
		return len(f) == 1, nil
	}); err != nil {
		t.Fatal("an adoption seen before the claim asked was not handed to it")
	}
	if sbx := <-found; sbx.Name != "pool-1" {
		t.Errorf("claim before got %s, want pool-1", sbx.Name)
	}
	// Adopted after: another claim's sandbox and this claim's, not yet Ready, hand it nothing.
	after, stop, ok := a.adoption(claim("after"))
	if !ok {
		t.Fatal("no adoption wait while watching")
	}
	defer stop()
	events.Add(adopted("pool-2", "someone-else", metav1.ConditionTrue))
	events.Modify(adopted("pool-3", "after", metav1.ConditionFalse))
	events.Modify(adopted("pool-3", "after", metav1.ConditionTrue))
	select {
	case sbx := <-after:
		if sbx.Name != "pool-3" || !adoptedAndReady(sbx, claim("after")) {
			t.Errorf("claim after got %s, want pool-3 adopted and Ready", sbx.Name)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the adoption after the claim asked was not handed to it")
	}
}
