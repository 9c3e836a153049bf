//go:build e2e

package e2e

import (
	"strings"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
)

// TestAnotherJobWithTheSameIDGetsItsOwnSandbox: a second job with the runner name and job ID of a
// prepared one, but its own token (another GitLab instance handing out the same IDs), gets a claim
// of its own name (the name is keyed with the token), its own pod, and runs there; it never
// reaches the first job's pod, and its cleanup leaves the first job's claim. The first job's
// retried prepare still adopts its claim and its pod.
func TestAnotherJobWithTheSameIDGetsItsOwnSandbox(t *testing.T) {
	t.Parallel()
	r := newCluster(t)
	first, pod, _ := preparedJob(t, r, ciImage)
	made := first.Claim(t)
	if made.Annotations[kube.AnnotationJobBinding] == "" || strings.Contains(made.Annotations[kube.AnnotationJobBinding], jobToken) {
		t.Fatalf("claim annotations %v: want a binding that is not the token", made.Annotations)
	}

	second := r.NewJob(t, clusterjobs.JobSpec{ID: first.ID, Image: ciImage, Token: "glcbt-e2e-another-instance"})
	if second.ClaimName() == first.ClaimName() {
		t.Fatalf("two jobs with different tokens share the claim name %s", first.ClaimName())
	}
	second.MustStage(t, 0, "config")
	secondPod := podFromPrepareLog(t, second.MustStage(t, 0, "prepare").Output())
	if secondPod == pod {
		t.Fatalf("the second job was given the first job's pod %s", pod)
	}
	mustContain(t, "the second job's run", second.MustRun(t, "echo second-job-ran-here > /tmp/second-job; echo second-job-ran\n").Output(), "second-job-ran")
	if out, err := first.Exec(t.Context(), pod, "sh", "-c", "cat /tmp/second-job 2>/dev/null || echo absent"); err != nil || strings.TrimSpace(out) != "absent" {
		t.Errorf("the second job's script reached the first job's pod %s: %q, %v", pod, out, err)
	}
	second.MustStage(t, 0, "cleanup")
	kept := first.Claim(t)
	if kept.UID != made.UID || kept.DeletionTimestamp != nil || clusterjobs.SandboxOfClaim(t, first.Admin, kept) != clusterjobs.SandboxOfClaim(t, first.Admin, made) {
		t.Fatalf("the second job touched the first job's claim: uid %s→%s, deleting %v", made.UID, kept.UID, kept.DeletionTimestamp)
	}

	retried := first.MustStage(t, 0, "prepare").Output()
	if got := podFromPrepareLog(t, retried); got != pod {
		t.Errorf("the first job's retried prepare took pod %s, want its own %s", got, pod)
	}
	if kept := first.Claim(t); kept.UID != made.UID {
		t.Errorf("the retried prepare made a new claim instead of adopting its own")
	}
	mustContain(t, "the first job's run", first.MustRun(t, "echo still-mine\n").Output(), "still-mine")
}
