package app_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/egress"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/fakecluster"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// A runner that dies never runs cleanup, so it never withdraws its jobs' egress grants: gc,
// reaping such a job's claim, withdraws the grant of the claim's pod as well.
func TestGCWithdrawsTheGrantOfAClaimItReaps(t *testing.T) {
	grants := &egress.Grants{}
	srv := httptest.NewServer(&egress.Admin{Recorder: &egress.Recorder{}, Grants: grants, Allow: egress.DefaultAdminAllow})
	defer srv.Close()
	h := newHarnessWithPool(t, "ci:bookworm", "", `images = ["ci:bookworm"]
egress_proxy = "`+srv.URL+`"
egress_allow = ["registry.npmjs.org:443"]`)
	if code, out, errOut := h.run("prepare"); code != 0 {
		t.Fatalf("prepare: exit %d\n%s%s", code, out, errOut)
	}
	if live := grants.Live(time.Now()); len(live) != 1 {
		t.Fatalf("after prepare: grants %+v, want the job pod's", live)
	}
	// The runner died here: no cleanup. Its claim is reaped as soon as it is older than 1 ns.
	code, out, errOut := h.run("gc", "--delete", "--older-than", "1ns")
	if code != 0 || !strings.Contains(out, "deleted ") {
		t.Fatalf("gc --delete: exit %d\n%s%s", code, out, errOut)
	}
	if live := grants.Live(time.Now()); len(live) != 0 {
		t.Errorf("after gc reaped the job's claim: grants %+v, want none\n%s%s", live, out, errOut)
	}
}

// A running job's pod holds its node's drain (the chart's PodDisruptionBudget refuses its
// eviction); gc --drain-timeout bounds that: it marks the job when it first sees the node
// cordoned, clears the mark when the node is uncordoned, and past the bound deletes the pod with
// the reason on the claim, which the job's next stage reports as the pod's end.
func TestGCEndsAJobThatHoldsADrainPastItsBound(t *testing.T) {
	h := newHarness(t, "ci:bookworm")
	ctx := context.Background()
	if code, out, errOut := h.run("prepare"); code != 0 {
		t.Fatalf("prepare: exit %d\n%s%s", code, out, errOut)
	}
	claimName := kube.ClaimName(testToken, "test-runner", 777)
	claims := h.cluster.Extensions.ExtensionsV1beta1().SandboxClaims(fakecluster.Namespace)
	pods := h.cluster.Kube.CoreV1().Pods(fakecluster.Namespace)
	podName := fakecluster.Pool + "-abcde"
	pod, err := pods.Get(ctx, podName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// As a warm pod a claim adopted is: scheduled, controlled by its Sandbox, with no claim label.
	pod.Spec.NodeName = "gvisor-1"
	delete(pod.Labels, extv1beta1.SandboxIDLabel)
	isController := true
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "agents.x-k8s.io/v1beta1", Kind: "Sandbox", Name: podName, UID: "uid-sandbox", Controller: &isController}}
	if _, err := pods.Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	nodes := h.cluster.Kube.CoreV1().Nodes()
	if _, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gvisor-1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cordon := func(unschedulable bool) {
		t.Helper()
		node, err := nodes.Get(ctx, "gvisor-1", metav1.GetOptions{})
		if err == nil {
			node.Spec.Unschedulable = unschedulable
			_, err = nodes.Update(ctx, node, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	annotation := func(key string) string {
		t.Helper()
		claim, err := claims.Get(ctx, claimName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return claim.Annotations[key]
	}
	gc := func(want string, args ...string) {
		t.Helper()
		code, out, errOut := h.run(append([]string{"gc", "--drain-timeout", "1h"}, args...)...)
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("gc %s: exit %d, want a line with %q\n%s%s", strings.Join(args, " "), code, want, out, errOut)
		}
	}

	gc("1 claims", "--delete") // schedulable: nothing to say, nothing marked
	if got := annotation(kube.AnnotationDrainSeen); got != "" {
		t.Fatalf("on a schedulable node: %s = %q, want none", kube.AnnotationDrainSeen, got)
	}
	cordon(true)
	gc("drain held: sandbox-executor/" + claimName + " (job 777, pod " + podName + " on node gvisor-1): the node is cordoned; gc ends the job after 1h0m0s")
	if got := annotation(kube.AnnotationDrainSeen); got != "" {
		t.Fatalf("a dry run marked the claim: %s = %q", kube.AnnotationDrainSeen, got)
	}
	gc("drain held:", "--delete")
	seen, err := time.Parse(time.RFC3339, annotation(kube.AnnotationDrainSeen))
	if err != nil || time.Since(seen) > time.Minute {
		t.Fatalf("after gc --delete saw the cordon: %s = %q (%v), want about now", kube.AnnotationDrainSeen, annotation(kube.AnnotationDrainSeen), err)
	}
	gc("gc ends the job in ", "--delete")

	cordon(false)
	gc("drain over: sandbox-executor/"+claimName, "--delete")
	if got := annotation(kube.AnnotationDrainSeen); got != "" {
		t.Fatalf("after the node was uncordoned: %s = %q, want none", kube.AnnotationDrainSeen, got)
	}

	// Cordoned again, and seen two hours ago: past the bound.
	cordon(true)
	twoHoursAgo := time.Now().Add(-2 * time.Hour).UTC().Format(time.RFC3339)
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, kube.AnnotationDrainSeen, twoHoursAgo)
	if _, err := claims.Patch(ctx, claimName, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	gc("would end sandbox-executor/" + claimName)
	if _, err := pods.Get(ctx, podName, metav1.GetOptions{}); err != nil {
		t.Fatalf("a dry run deleted the pod: %v", err)
	}
	gc("ended sandbox-executor/"+claimName+" (job 777, pod "+podName+" on node gvisor-1): it held the drain past 1h0m0s", "--delete")
	if _, err := pods.Get(ctx, podName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("after gc ended the job: pod get: %v, want it deleted", err)
	}
	why, err := h.cluster.Claimer().PodGone(ctx, &kube.Sandbox{Namespace: fakecluster.Namespace, Claim: claimName, Pod: podName})
	if err != nil {
		t.Fatal(err)
	}
	want := "node gvisor-1 is being drained and this job held the drain past drain.runningJobTimeout (1h0m0s, since " + twoHoursAgo + "): sandbox-executor gc ended it (pod sandbox-executor/" + podName + " was deleted)"
	if why != want {
		t.Errorf("the job's next stage says\n%q\nwant\n%q", why, want)
	}
}

func TestGCRefusesANegativeDrainTimeout(t *testing.T) {
	h := newHarness(t, "ci:1")
	code, out, errOut := h.run("gc", "--drain-timeout", "-1s")
	if code != 1 || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "--drain-timeout -1s: want a positive duration, or 0 for no bound") {
		t.Fatalf("gc --drain-timeout -1s: exit %d, want 1 and one line naming the flag\n%s%s", code, out, errOut)
	}
}
