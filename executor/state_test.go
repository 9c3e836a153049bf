package executor_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

const stateFileName = "sandbox-executor-state.json"

func coldStartState() *executor.JobState {
	return &executor.JobState{
		Sandbox: &kube.Sandbox{Namespace: "ns", SandboxName: "job-7-abc", Pod: "job-7-abc", PodUID: "uid", Container: "job",
			RuntimeClass: "gvisor", Launch: kube.LaunchCold, ColdTemplate: "duo-gvisor", PodIP: "10.0.0.7", AgentBaked: true, Restarts: 2},
		Transport: executor.Transport{AgentIdentity: "sha256:" + strings.Repeat("ab", 32)},
		Overhead:  executor.Overhead{Claim: time.Second, Prepare: 2 * time.Second, Stages: 1, StageTotal: time.Millisecond, ScriptTotal: 3 * time.Millisecond},
	}
}

// What prepare saves is what the stages after it load, field for field.
func TestSavedJobRoundTrips(t *testing.T) {
	dir := t.TempDir()
	want := coldStartState()
	if err := executor.SaveJob(dir, want); err != nil {
		t.Fatal(err)
	}
	got, err := executor.SavedJob(dir, "job-7-abc")
	if err != nil || got == nil || *got.Sandbox != *want.Sandbox || got.Transport != want.Transport || got.Overhead != want.Overhead {
		t.Fatalf("SavedJob = %+v, %v; want %+v", got, err, want)
	}
	loaded, err := executor.LoadJob(context.Background(), dir, "job-7-abc", func(context.Context) (*kube.Sandbox, error) {
		t.Error("LoadJob looked in the cluster although prepare left the job's state")
		return nil, nil
	})
	if err != nil || *loaded.Sandbox != *want.Sandbox {
		t.Errorf("LoadJob = %+v, %v", loaded, err)
	}
}

// A state file written before cold starts existed, or before the record had a version, still
// loads as a claim's.
func TestSavedJobOfAClaim(t *testing.T) {
	dir := t.TempDir()
	sbx := &kube.Sandbox{Namespace: "ns", Claim: "job-1-abc", Pool: "p", SandboxName: "p-xyz", Pod: "p-xyz", Launch: kube.LaunchWaited, Waited: 812 * time.Millisecond}
	if err := executor.SaveJob(dir, &executor.JobState{Sandbox: sbx}); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(filepath.Join(dir, stateFileName))
	if strings.Contains(string(data), "coldTemplate") || strings.Contains(string(data), "agentIdentity") {
		t.Errorf("a claim's state over exec mentions coldTemplate or agentIdentity: %s", data)
	}
	// The summary says what the "Sandbox ready" line said: how the job got its sandbox travels.
	if got, err := executor.SavedJob(dir, "job-1-abc"); err != nil || got == nil || *got.Sandbox != *sbx {
		t.Errorf("SavedJob = %+v, %v", got, err)
	}
	if got, _ := executor.SavedJob(dir, "job-2-abc"); got != nil {
		t.Errorf("another job's state: %+v", got)
	}
	unversioned := `{"namespace":"ns","claim":"job-1-abc","pool":"p","sandbox":"p-xyz","pod":"p-xyz","podUID":"u","container":"job","runtimeClass":"gvisor","warm":true,"overhead":{"claim":0,"prepare":5,"stages":0,"stageTotal":0}}`
	if err := os.WriteFile(filepath.Join(dir, stateFileName), []byte(unversioned), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := executor.SavedJob(dir, "job-1-abc"); err != nil || got == nil || got.Sandbox.Launch != kube.LaunchWarm || got.Overhead.Prepare != 5 {
		t.Errorf("SavedJob of an unversioned file = %+v, %v", got, err)
	}
}

// A state file that is not state is a system failure that names it, not a missing file.
func TestCorruptStateFileIsAnErrorNamingIt(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, stateFileName)
	for _, content := range []string{`{"namespace":`, `{"version":99,"pod":"p","claim":"job-1-abc"}`} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := executor.SavedJob(dir, "job-1-abc")
		if got != nil || failure.KindOf(err) != failure.KindSystem || !strings.Contains(err.Error(), path) {
			t.Errorf("SavedJob of %q = %+v, %v; want a system failure naming %s", content, got, err, path)
		}
		if _, err := executor.LoadJob(context.Background(), dir, "job-1-abc", func(context.Context) (*kube.Sandbox, error) {
			return &kube.Sandbox{Pod: "found-again"}, nil
		}); err == nil {
			t.Errorf("LoadJob of %q found the sandbox again instead of failing", content)
		}
	}
}

// A job prepared by the version before TLS (a state record with the network path's token)
// finishes over exec after the upgrade: the token is neither kept nor used.
func TestAVersion2RecordGoesOverExec(t *testing.T) {
	dir := t.TempDir()
	record := `{"version":2,"namespace":"ns","claim":"job-1-abc","pool":"p","sandboxName":"p-xyz","pod":"p-xyz","container":"job","podIP":"10.0.0.7","agentToken":"0123456789abcdef0123456789abcdef","agentBaked":true,"launch":"warm","overhead":{}}`
	if err := os.WriteFile(filepath.Join(dir, stateFileName), []byte(record), 0o600); err != nil {
		t.Fatal(err)
	}
	job, err := executor.SavedJob(dir, "job-1-abc")
	if err != nil || job == nil {
		t.Fatalf("LoadJob = %v, %v", job, err)
	}
	if job.Transport.Network() || job.Sandbox.Pod != "p-xyz" {
		t.Errorf("a version 2 record loads as %+v over %s; want pod p-xyz over exec", job.Sandbox, job.Transport)
	}
}

// The job's outcome is its first failure that decides it (after_script's never does), it
// survives the state file, and is success when no stage failed.
func TestJobOutcomeIsTheFirstDecidingFailure(t *testing.T) {
	dir := t.TempDir()
	job := &executor.JobState{Sandbox: &kube.Sandbox{Namespace: "ns", Claim: "job-1", Pod: "pod"}}
	if got := job.Outcome(); got != (kube.Outcome{Result: kube.OutcomeSuccess}) {
		t.Fatalf("no failure: outcome %+v", got)
	}
	job.RecordFailure("after_script", failure.BuildError(3))
	job.RecordFailure("step_script", failure.BuildError(1))
	job.RecordFailure("upload_artifacts_on_failure", failure.SystemError(nil, "pod gone"))
	if err := executor.SaveJob(dir, job); err != nil {
		t.Fatal(err)
	}
	saved, err := executor.SavedJob(dir, "job-1")
	if err != nil || saved == nil {
		t.Fatalf("saved job: %v, %v", saved, err)
	}
	if got, want := saved.Outcome(), (kube.Outcome{Result: kube.OutcomeFailed, Reason: kube.ReasonScript}); got != want {
		t.Errorf("outcome %+v, want %+v", got, want)
	}
	for _, tc := range []struct {
		err  error
		want kube.Outcome
	}{
		{context.Canceled, kube.Outcome{Result: kube.OutcomeCanceled}},
		{executor.ErrJobTimedOut, kube.Outcome{Result: kube.OutcomeFailed, Reason: kube.ReasonTimeout}},
		{failure.SystemError(nil, "x"), kube.Outcome{Result: kube.OutcomeFailed, Reason: kube.ReasonSystem}},
		{failure.PermanentError(nil, "x"), kube.Outcome{Result: kube.OutcomeFailed, Reason: kube.ReasonPermanent}},
	} {
		j := &executor.JobState{}
		j.RecordFailure("step_script", tc.err)
		if j.Outcome() != tc.want {
			t.Errorf("%v: outcome %+v, want %+v", tc.err, j.Outcome(), tc.want)
		}
	}
}

// The runner stops a stage with the same SIGTERM for a cancel and for the job's timeout: a stop
// from 10 s before the job's deadline on is its timeout (the runner's clock started a little
// before prepare, and the signal takes time to land), one before that or without a deadline a
// cancel.
func TestATimeoutIsToldFromACancelByTheJobsDeadline(t *testing.T) {
	deadline := time.Date(2026, 11, 24, 6, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name     string
		deadline time.Time
		at       time.Time
		want     error
		outcome  kube.Outcome
	}{
		{"a minute before the deadline", deadline, deadline.Add(-time.Minute), context.Canceled, kube.Outcome{Result: kube.OutcomeCanceled}},
		{"just outside the slack", deadline, deadline.Add(-10*time.Second - time.Millisecond), context.Canceled, kube.Outcome{Result: kube.OutcomeCanceled}},
		{"at the start of the slack", deadline, deadline.Add(-10 * time.Second), executor.ErrJobTimedOut, kube.Outcome{Result: kube.OutcomeFailed, Reason: kube.ReasonTimeout}},
		{"at the deadline", deadline, deadline, executor.ErrJobTimedOut, kube.Outcome{Result: kube.OutcomeFailed, Reason: kube.ReasonTimeout}},
		{"after the deadline", deadline, deadline.Add(time.Minute), executor.ErrJobTimedOut, kube.Outcome{Result: kube.OutcomeFailed, Reason: kube.ReasonTimeout}},
		{"no deadline", time.Time{}, deadline.Add(time.Minute), context.Canceled, kube.Outcome{Result: kube.OutcomeCanceled}},
	} {
		job := &executor.JobState{Deadline: tc.deadline}
		got := job.StopCause(tc.at)
		if got != tc.want {
			t.Errorf("%s: StopCause = %v, want %v", tc.name, got, tc.want)
		}
		job.RecordFailure("step_script", got)
		if job.Outcome() != tc.outcome {
			t.Errorf("%s: outcome %+v, want %+v", tc.name, job.Outcome(), tc.outcome)
		}
	}
}

// The job's deadline survives the state file; a state file from before it was kept (no
// deadline) still loads, and a stop is then a cancel.
func TestTheStateFileKeepsTheJobsDeadline(t *testing.T) {
	dir := t.TempDir()
	deadline := time.Date(2026, 11, 24, 6, 0, 0, 0, time.UTC)
	want := coldStartState()
	want.Deadline = deadline
	if err := executor.SaveJob(dir, want); err != nil {
		t.Fatal(err)
	}
	got, err := executor.SavedJob(dir, "job-7-abc")
	if err != nil || got == nil || !got.Deadline.Equal(deadline) {
		t.Fatalf("SavedJob = %+v, %v; want deadline %s", got, err, deadline)
	}
	if err := executor.SaveJob(dir, &executor.JobState{Sandbox: want.Sandbox}); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(filepath.Join(dir, stateFileName)); strings.Contains(string(data), "deadline") {
		t.Errorf("a state without a deadline writes one: %s", data)
	}
	old := `{"version":3,"namespace":"ns","claim":"job-1-abc","pool":"p","sandbox":"p-xyz","pod":"p-xyz","podUID":"u","container":"job","runtimeClass":"gvisor","launch":"warm","overhead":{"claim":1,"prepare":5,"stages":0,"stageTotal":0},"failed":{"result":"failed","reason":"script_failure"}}`
	if err := os.WriteFile(filepath.Join(dir, stateFileName), []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err = executor.SavedJob(dir, "job-1-abc")
	if err != nil || got == nil || !got.Deadline.IsZero() || got.Overhead.Prepare != 5 || got.Failed.Reason != kube.ReasonScript {
		t.Fatalf("SavedJob of a state file without a deadline = %+v, %v", got, err)
	}
	if cause := got.StopCause(deadline.Add(time.Hour)); cause != context.Canceled {
		t.Errorf("StopCause without a deadline = %v, want context.Canceled", cause)
	}
}
