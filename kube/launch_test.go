package kube_test

import (
	"context"
	"regexp"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/fakecluster"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// tickingClock moves on by a tenth of a second each time it is read, so that a claim takes time.
type tickingClock struct{ now time.Time }

func (c *tickingClock) Now() time.Time {
	c.now = c.now.Add(100 * time.Millisecond)
	return c.now
}

func (c *tickingClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// Claim says how the job got its sandbox from what agent-sandbox did with the claim, and the
// job log says it in those words.
func TestClaimSaysHowTheJobGotItsSandbox(t *testing.T) {
	for _, tc := range []struct {
		launch kube.Launch
		origin string
	}{
		{kube.LaunchWarm, `^pool duo-default \(warm start\)$`},
		{kube.LaunchWaited, `^pool duo-default \(waited \d+ ms for a warm sandbox\)$`},
		{kube.LaunchCold, `^pool duo-default \(cold start: the pool had no sandbox to hand out\)$`},
	} {
		t.Run(string(tc.launch), func(t *testing.T) {
			fc := fakecluster.NewCluster(t)
			fc.Launch = tc.launch
			sbx, err := kube.NewClaimer(fc.Clients, &tickingClock{now: fakecluster.Now}).Claim(context.Background(), testRequest())
			if err != nil {
				t.Fatal(err)
			}
			origin, acquired := sbx.Origin()
			if sbx.Launch != tc.launch || !regexp.MustCompile(tc.origin).MatchString(origin) || acquired != "claimed" {
				t.Errorf("launch %q, origin %q, %s; want %q, %s", sbx.Launch, origin, acquired, tc.launch, tc.origin)
			}
			if (sbx.Waited > 0) != (tc.launch == kube.LaunchWaited) {
				t.Errorf("waited %s for a %s start", sbx.Waited, tc.launch)
			}
		})
	}
}

// The launch comes from the objects alone (a later stage that finds the claim again reads the
// same), and a sandbox that turned Ready in the claim's own second is never called warm: the
// objects' times have one-second resolution.
func TestResolveReadsTheLaunchFromTheObjects(t *testing.T) {
	made := fakecluster.Now // a claim's creationTimestamp, in whole seconds
	for _, tc := range []struct {
		name  string
		label string
		ready time.Duration // Ready since made+ready; 0: no Ready condition
		want  kube.Launch
	}{
		{"Ready a minute before the claim", sandboxv1beta1.SandboxLaunchTypeWarm, -time.Minute, kube.LaunchWarm},
		{"Ready the second before the claim", sandboxv1beta1.SandboxLaunchTypeWarm, -time.Second, kube.LaunchWarm},
		{"Ready in the claim's own second", sandboxv1beta1.SandboxLaunchTypeWarm, time.Nanosecond, kube.LaunchWaited},
		{"Ready after the claim: adopted while booting", sandboxv1beta1.SandboxLaunchTypeWarm, 2 * time.Second, kube.LaunchWaited},
		{"adopted, no Ready condition", sandboxv1beta1.SandboxLaunchTypeWarm, 0, kube.LaunchWaited},
		{"created for the claim", sandboxv1beta1.SandboxLaunchTypeCold, 2 * time.Second, kube.LaunchCold},
		{"no launch-type label", "", -time.Minute, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc := fakecluster.NewCluster(t)
			ctx := context.Background()
			claim := &extv1beta1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Name: "job-1", Namespace: fakecluster.Namespace, UID: "claim-uid", CreationTimestamp: metav1.NewTime(made)}}
			claim.Spec.WarmPoolRef.Name = fakecluster.Pool
			claim.Status.SandboxStatus.Name = "duo-default-xyz"
			sbx := &sandboxv1beta1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: "duo-default-xyz", Namespace: fakecluster.Namespace, Labels: map[string]string{}}}
			if tc.label != "" {
				sbx.Labels[sandboxv1beta1.SandboxLaunchTypeLabel] = tc.label
			}
			if tc.ready != 0 {
				sbx.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "DependenciesReady",
					LastTransitionTime: metav1.NewTime(made.Add(tc.ready).Truncate(time.Second))}}
			}
			rc := "gvisor"
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: sbx.Name, Namespace: fakecluster.Namespace, Labels: map[string]string{extv1beta1.SandboxIDLabel: string(claim.UID)}},
				Spec:   corev1.PodSpec{RuntimeClassName: &rc, Containers: []corev1.Container{{Name: "job", Image: "ci:bookworm"}}},
				Status: corev1.PodStatus{Phase: corev1.PodRunning}}
			if _, err := fc.Sandboxes.AgentsV1beta1().Sandboxes(fakecluster.Namespace).Create(ctx, sbx, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := fc.Kube.CoreV1().Pods(fakecluster.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			got, err := fc.Claimer().Resolve(ctx, claim, []string{"gvisor"})
			if err != nil || got.Launch != tc.want {
				t.Errorf("Resolve = %+v, %v; want launch %q", got, err, tc.want)
			}
		})
	}
}
