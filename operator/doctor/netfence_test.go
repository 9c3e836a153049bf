package doctor_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandbox-executor/sandbox-executor/agent/netfence"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/operator/doctor"
)

// oldRunsc is what the netfence verb says on a runsc older than netfence.MinRunsc.
const oldRunsc = "sandbox-executor-agent netfence: this runtime lets a job rewrite the netstack fence: a process without CAP_NET_ADMIN got EINVAL (invalid argument) to IPT_SO_SET_REPLACE, not EPERM (no CAP_NET_ADMIN check); netfence needs runsc " + netfence.MinRunsc + " or later (docs/install.md), or set the chart's jobDefaults.netstackFence.enabled=false"

// withNetfence gives the fixture's template the chart's netfence init container, and its pool
// the selector agent-sandbox reports for its pods.
func withNetfence(f *fixture) {
	f.tmpl.Spec.PodTemplate.Spec.InitContainers = []corev1.Container{{
		Name: "netfence", Image: "agent:1", Command: []string{"/sandbox-executor-agent"}, Args: []string{"netfence", "--reply-to", "10.244.0.0/16"},
	}}
	f.pool.Status.Selector = "agents.x-k8s.io/pool=duo-default"
}

// addPod adds a pod of the pool (or, with other, of no pool) whose netfence container is in
// state, after last.
func addPod(t *testing.T, f *fixture, name string, other bool, state, last corev1.ContainerState) {
	t.Helper()
	labels := map[string]string{"agents.x-k8s.io/pool": "duo-default"}
	if other {
		labels = map[string]string{"agents.x-k8s.io/pool": "another"}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Status:     corev1.PodStatus{InitContainerStatuses: []corev1.ContainerStatus{{Name: "netfence", State: state, LastTerminationState: last}}},
	}
	if _, err := f.kube.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

var (
	completed = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}}
	refused   = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 125, Reason: "Error", Message: oldRunsc + "\n"}}
	backoff   = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}
	running   = corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	none      = corev1.ContainerState{}
)

// doctor cannot ask runsc its version; it reports what each pool's pods' netfence init
// container found, which names the runsc release it needs.
func TestNetfenceReportsWhatThePoolsPodsFound(t *testing.T) {
	const check = "netfence pool duo-default"
	t.Run("proven", func(t *testing.T) {
		f := newFixture(t)
		withNetfence(f)
		c := f.checker(t, nil)
		addPod(t, f, "pod-a", false, completed, none)
		addPod(t, f, "pod-b", false, completed, none)
		addPod(t, f, "pod-x", true, refused, none) // another pool's
		expect(t, c.Run(context.Background()), check, doctor.OK, "in 2 of 2 pods the netfence init container proved the runtime", "runsc "+netfence.MinRunsc+" or later")
	})
	t.Run("an old runsc, restarting", func(t *testing.T) {
		f := newFixture(t)
		withNetfence(f)
		c := f.checker(t, nil)
		addPod(t, f, "pod-a", false, completed, none)
		addPod(t, f, "pod-b", false, backoff, refused)
		expect(t, c.Run(context.Background()), check, doctor.Fail, "failed in 1 of 2 pods, so they never start; pod-b: "+oldRunsc,
			"upgrade runsc on the nodes of the pool's RuntimeClass to "+netfence.MinRunsc+" or later", "kubectl -n sandbox-executor logs pod-b -c netfence", "netstackFence: false")
	})
	t.Run("an old runsc, ended", func(t *testing.T) {
		f := newFixture(t)
		withNetfence(f)
		c := f.checker(t, nil)
		addPod(t, f, "pod-a", false, refused, none)
		expect(t, c.Run(context.Background()), check, doctor.Fail, "failed in 1 of 1 pods", "pod-a: "+oldRunsc)
	})
	t.Run("no message", func(t *testing.T) {
		f := newFixture(t)
		withNetfence(f)
		c := f.checker(t, nil)
		addPod(t, f, "pod-a", false, corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 125, Reason: "Error"}}, none)
		expect(t, c.Run(context.Background()), check, doctor.Fail, "pod-a: Error (exit 125)")
	})
	t.Run("not run yet", func(t *testing.T) {
		f := newFixture(t)
		withNetfence(f)
		c := f.checker(t, nil)
		addPod(t, f, "pod-a", false, running, none)
		expect(t, c.Run(context.Background()), check, doctor.Warn, "needs runsc "+netfence.MinRunsc+" or later", "none of the pool's 1 pods has run it yet")
	})
	t.Run("pods not listable", func(t *testing.T) {
		f := newFixture(t)
		withNetfence(f)
		c := f.checker(t, nil)
		forbid(f, "list", kube.Pods)
		expect(t, c.Run(context.Background()), check, doctor.Warn, "needs runsc "+netfence.MinRunsc+" or later", "may not list pods", "-doctor")
	})
	t.Run("no selector", func(t *testing.T) {
		f := newFixture(t)
		withNetfence(f)
		f.pool.Status.Selector = ""
		expect(t, f.checker(t, nil).Run(context.Background()), check, doctor.Warn, "no status.selector")
	})
	t.Run("no netfence", func(t *testing.T) {
		f := newFixture(t)
		for _, r := range f.checker(t, nil).Run(context.Background()) {
			if r.Check == check {
				t.Errorf("a template without netfence has a netfence line: %s", r)
			}
		}
	})
}
