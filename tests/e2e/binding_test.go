//go:build e2e

package e2e

import (
	"slices"
	"strings"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
)

// TestClaimBoundToItsJob: a second job with the runner name and job ID of a prepared one, but
// its own token (another GitLab instance handing out the same IDs), meets the first job's claim.
// Its prepare is refused in one line naming the claim, its run never reaches the pod, its cleanup
// leaves the claim; the first job's retried prepare still adopts the claim and its pod.
func TestClaimBoundToItsJob(t *testing.T) {
	r := newCluster(t)
	first, pod, _ := preparedJob(t, r, ciImage)
	made := first.Claim(t)
	if made.Annotations[kube.AnnotationJobBinding] == "" || strings.Contains(made.Annotations[kube.AnnotationJobBinding], jobToken) {
		t.Fatalf("claim annotations %v: want a binding that is not the token", made.Annotations)
	}

	second := r.NewJob(t, clusterjobs.JobSpec{ID: first.ID, Image: ciImage, Token: "glcbt-e2e-another-instance"})
	second.MustStage(t, 0, "config")
	refused := second.MustStage(t, clusterjobs.BuildFailure, "prepare").Output()
	refusal := "SandboxClaim " + namespace + "/" + first.ClaimName() + " was made by another job"
	fix := "kubectl delete sandboxclaim " + first.ClaimName() + " -n " + namespace
	if !slices.ContainsFunc(strings.Split(refused, "\n"), func(line string) bool {
		return strings.Contains(line, refusal) && strings.Contains(line, fix)
	}) {
		t.Errorf("the second job's prepare has no line %q ... %q:\n%s", refusal, fix, refused)
	}
	ran := second.Run(t, "echo second-job-ran-here > /tmp/second-job\n")
	if ran.ExitCode == 0 || strings.Contains(ran.Output(), "second-job-ran-here") {
		t.Errorf("the second job's run: exit %d, want a refusal\n%s", ran.ExitCode, ran.Output())
	}
	if out, err := first.Exec(t.Context(), pod, "sh", "-c", "cat /tmp/second-job 2>/dev/null || echo absent"); err != nil || strings.TrimSpace(out) != "absent" {
		t.Errorf("the second job's script reached pod %s: %q, %v", pod, out, err)
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
