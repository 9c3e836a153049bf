package prepare

import (
	"context"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/gitlab"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// The state prepare saves carries the job's deadline, prepare's start plus the job's timeout,
// by which run tells the runner's SIGTERM at the timeout from a cancel.
func TestPrepareSavesTheJobsDeadline(t *testing.T) {
	env, _, _, _ := grantStand(t, "")
	env.Runner.TmpDir = t.TempDir()
	job := &gitlab.Job{ID: 7, Timeout: 3 * time.Hour}
	p := &preparation{env: env, cluster: &releases{}, job: job, req: kube.ClaimRequest{Binding: "b"}, start: now}
	if err := p.grantAndKeep(context.Background(), flowSandbox, executor.Transport{}, time.Second); err != nil {
		t.Fatal(err)
	}
	saved, err := executor.SavedJob(env.Runner.TmpDir, flowSandbox.JobObject())
	if err != nil || saved == nil {
		t.Fatalf("SavedJob = %+v, %v", saved, err)
	}
	if want := now.Add(3 * time.Hour); !saved.Deadline.Equal(want) {
		t.Errorf("saved deadline %s, want %s", saved.Deadline, want)
	}
}
