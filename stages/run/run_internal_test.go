package run

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/gitlab"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/stages"
)

// sigterm stands for the pod's agent and the runner: the stage starts, the runner's SIGTERM
// cancels it at the time at on the stage's clock, and stopping its processes succeeds.
type sigterm struct {
	clock  *testingclock.FakeClock
	at     time.Time
	cancel context.CancelFunc
	kills  int
}

func (s *sigterm) Exec(ctx context.Context, req kube.ExecRequest) error {
	switch {
	case len(req.Command) > 1 && req.Command[1] == "start":
		s.clock.SetTime(s.at)
		s.cancel()
		<-ctx.Done()
		return ctx.Err()
	case len(req.Command) > 1 && req.Command[1] == "kill":
		s.kills++
		return nil
	}
	return fmt.Errorf("unexpected command %q", req.Command)
}

// The runner stops a stage with the same SIGTERM when the job is cancelled and when it runs past
// its timeout; GitLab counts the one canceled, the other failed with job_execution_timeout. The
// run stage tells them apart by the deadline prepare saved, and keeps the outcome for cleanup.
func TestAStageStoppedAtTheJobsTimeoutRecordsATimeoutNotACancel(t *testing.T) {
	prepared := time.Date(2026, 11, 24, 5, 0, 0, 0, time.UTC)
	deadline := prepared.Add(time.Hour)
	for _, tc := range []struct {
		name string
		at   time.Time
		want kube.Outcome
	}{
		{"cancelled well before the deadline", prepared.Add(10 * time.Minute), kube.Outcome{Result: kube.OutcomeCanceled}},
		{"stopped just before the deadline (the runner's clock started before prepare)", deadline.Add(-2 * time.Second), kube.Outcome{Result: kube.OutcomeFailed, Reason: kube.ReasonTimeout}},
		{"stopped after the deadline", deadline.Add(time.Second), kube.Outcome{Result: kube.OutcomeFailed, Reason: kube.ReasonTimeout}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			cfg, err := config.Parse("c.toml", []byte("namespace = \"ns\"\nrunner_name = \"r\"\n[[pool]]\nname = \"p\"\n"))
			if err != nil {
				t.Fatal(err)
			}
			jobFile := filepath.Join(tmp, "response.json")
			if err := os.WriteFile(jobFile, []byte(`{"id":7,"token":"t0ken","runner_info":{"timeout":3600}}`), 0o600); err != nil {
				t.Fatal(err)
			}
			script := filepath.Join(tmp, "script")
			if err := os.WriteFile(script, []byte("sleep 3600\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			claim := kube.ClaimName("t0ken", "r", 7)
			state := &executor.JobState{
				Sandbox:  &kube.Sandbox{Namespace: "ns", Claim: claim, Pool: "p", Pod: claim + "-pod", Container: "job"},
				Overhead: executor.Overhead{Claim: time.Second, Prepare: 2 * time.Second},
				Deadline: deadline,
			}
			if err := executor.SaveJob(tmp, state); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			clock := testingclock.NewFakeClock(prepared.Add(3 * time.Second))
			pod := &sigterm{clock: clock, at: tc.at, cancel: cancel}
			var log strings.Builder
			env := &stages.Env{
				Config: cfg, Runner: gitlab.RunnerEnv{TmpDir: tmp, JobResponseFile: jobFile},
				Stdout: io.Discard, Stderr: &log, Clock: clock,
				Clients: func() (*kube.Clients, error) { return &kube.Clients{Exec: pod}, nil },
			}
			if err := Run(ctx, env, script, "step_script"); !errors.Is(err, executor.ErrCancelled) || pod.kills != 1 {
				t.Fatalf("Run = %v after %d kills, want the stage cancelled and stopped once; job log:\n%s", err, pod.kills, log.String())
			}
			saved, err := executor.SavedJob(tmp, claim)
			if err != nil || saved == nil {
				t.Fatalf("SavedJob = %+v, %v", saved, err)
			}
			if got := saved.Outcome(); got != tc.want {
				t.Errorf("outcome %+v, want %+v", got, tc.want)
			}
		})
	}
}
