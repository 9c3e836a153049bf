package executor

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// JobState is what prepare leaves the later stages of a job: its sandbox, how the stages reach
// the sandbox's agent, and the executor's own time so far.
type JobState struct {
	Sandbox   *kube.Sandbox
	Transport Transport
	Overhead  Overhead
	// Failed is the job's first failure (RecordFailure), for cleanup to record on the claim;
	// zero while every stage that decides the job's outcome succeeded.
	Failed kube.Outcome
	// Deadline is when the job's timeout runs out: prepare's start plus the job's timeout. Zero
	// when unknown (a state saved before it was kept, or found again in the cluster).
	Deadline time.Time
}

// ErrJobTimedOut is why a stage stopped when the job ran past its timeout. The runner stops a
// timed-out stage exactly as a cancelled one (SIGTERM, a cancelled context), but GitLab fails the
// job (job_execution_timeout) rather than cancelling it: StopCause tells the two apart.
var ErrJobTimedOut = errors.New("the job ran past its timeout")

// timeoutSlack is how long before Deadline a stop still counts as the job's timeout: the runner
// starts its timeout clock a little before prepare starts, and its signal takes time to land.
const timeoutSlack = 10 * time.Second

// StopCause is why the runner stopped the job's stage at now with its SIGTERM: ErrJobTimedOut
// from timeoutSlack before the job's Deadline on, else (or with no Deadline) context.Canceled.
func (j *JobState) StopCause(now time.Time) error {
	if !j.Deadline.IsZero() && !now.Before(j.Deadline.Add(-timeoutSlack)) {
		return ErrJobTimedOut
	}
	return context.Canceled
}

// RecordFailure notes how the stage stageName failed with err, unless an earlier stage already
// failed the job: the first failure is the job's. after_script does not decide a job's outcome
// (the runner ignores its failure), so it is not recorded.
func (j *JobState) RecordFailure(stageName string, err error) {
	if err == nil || j.Failed.Result != "" || stageName == "after_script" {
		return
	}
	j.Failed = failureOutcome(err)
}

// failureOutcome classifies a stage's error for the outcome metric.
func failureOutcome(err error) kube.Outcome {
	switch {
	case errors.Is(err, ErrJobTimedOut):
		return kube.Outcome{Result: kube.OutcomeFailed, Reason: kube.ReasonTimeout}
	case errors.Is(err, context.Canceled):
		return kube.Outcome{Result: kube.OutcomeCanceled}
	case failure.KindOf(err) == failure.KindBuild:
		return kube.Outcome{Result: kube.OutcomeFailed, Reason: kube.ReasonScript}
	case failure.KindOf(err) == failure.KindPermanent:
		return kube.Outcome{Result: kube.OutcomeFailed, Reason: kube.ReasonPermanent}
	default:
		return kube.Outcome{Result: kube.OutcomeFailed, Reason: kube.ReasonSystem}
	}
}

// Outcome is the job's outcome once its stages are over: its first failure, else success.
func (j *JobState) Outcome() kube.Outcome {
	if j.Failed.Result != "" {
		return j.Failed
	}
	return kube.Outcome{Result: kube.OutcomeSuccess}
}

// stateFile is where prepare leaves the job's state for the stages after it: the runner's
// per-job TMPDIR, which it removes when the job ends.
const stateFile = "sandbox-executor-state.json"

// stateVersion is the version of stateRecord written now. Version 0 is the same schema from
// before the record was versioned: a job whose runner host is upgraded mid-job keeps its state.
// Version 2 adds launch and waited; before it, warm alone said how the job got its sandbox.
// Version 3 replaces the network path's token with the agent's identity: a job prepared before
// the upgrade finishes over exec.
const stateVersion = 3

// stateRecord is the state file's schema. It is kept apart from kube.Sandbox so that a change to
// the one is a decision about the other, and versioned so that a reader knows what it reads.
type stateRecord struct {
	Version      int    `json:"version"`
	Namespace    string `json:"namespace"`
	Claim        string `json:"claim"`
	Pool         string `json:"pool"`
	SandboxName  string `json:"sandbox"`
	Pod          string `json:"pod"`
	PodUID       string `json:"podUID"`
	Container    string `json:"container"`
	RuntimeClass string `json:"runtimeClass"`
	// Warm is how records before version 2 said the launch: read, no longer written.
	Warm         bool          `json:"warm,omitempty"`
	Launch       kube.Launch   `json:"launch,omitempty"`
	Waited       time.Duration `json:"waited,omitempty"`
	ColdTemplate string        `json:"coldTemplate,omitempty"`
	PodIP        string        `json:"podIP,omitempty"`
	// AgentIdentity pins the agent's key on the network path (public); version 2 records had
	// an agentToken here, which a version 3 record never holds.
	AgentIdentity string   `json:"agentIdentity,omitempty"`
	AgentBaked    bool     `json:"agentBaked,omitempty"`
	Restarts      int32    `json:"restarts,omitempty"`
	Overhead      Overhead `json:"overhead"`
	// Failed is optional and ignored by older readers, so it needs no new version.
	Failed kube.Outcome `json:"failed,omitzero"`
	// Deadline is optional and ignored by older readers too: no new version either.
	Deadline time.Time `json:"deadline,omitzero"`
}

func recordOf(job *JobState) stateRecord {
	s := job.Sandbox
	return stateRecord{
		Version: stateVersion, Namespace: s.Namespace, Claim: s.Claim, Pool: s.Pool, SandboxName: s.SandboxName,
		Pod: s.Pod, PodUID: s.PodUID, Container: s.Container, RuntimeClass: s.RuntimeClass,
		Launch: s.Launch, Waited: s.Waited, ColdTemplate: s.ColdTemplate, PodIP: s.PodIP, AgentIdentity: job.Transport.AgentIdentity, AgentBaked: s.AgentBaked,
		Restarts: s.Restarts, Overhead: job.Overhead, Failed: job.Failed, Deadline: job.Deadline,
	}
}

func (r *stateRecord) job() *JobState {
	launch := r.Launch
	if r.Version < 2 {
		// Before version 2, warm copied agent-sandbox's launch-type label: warm, else cold.
		launch = kube.LaunchCold
		if r.Warm {
			launch = kube.LaunchWarm
		}
	}
	return &JobState{
		Sandbox: &kube.Sandbox{
			Namespace: r.Namespace, Claim: r.Claim, Pool: r.Pool, SandboxName: r.SandboxName, Pod: r.Pod,
			PodUID: r.PodUID, Container: r.Container, RuntimeClass: r.RuntimeClass, Launch: launch, Waited: r.Waited,
			ColdTemplate: r.ColdTemplate, PodIP: r.PodIP, AgentBaked: r.AgentBaked, Restarts: r.Restarts,
		},
		Transport: Transport{AgentIdentity: r.AgentIdentity},
		Overhead:  r.Overhead,
		Failed:    r.Failed,
		Deadline:  r.Deadline,
	}
}

// SaveJob records the job's state for later stages.
func SaveJob(tmpDir string, job *JobState) error {
	if tmpDir == "" {
		return nil // older runners: later stages find the sandbox again
	}
	data, err := json.Marshal(recordOf(job))
	if err != nil {
		return err
	}
	tmp := filepath.Join(tmpDir, stateFile+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return failure.SystemError(err, "saving job state")
	}
	return os.Rename(tmp, filepath.Join(tmpDir, stateFile))
}

// SavedJob is the state prepare saved for the job named claimName, or nil if there is none (no
// TMPDIR, prepare did not get that far, another job's state). A file that cannot be read as
// state is an error naming it.
func SavedJob(tmpDir, claimName string) (*JobState, error) {
	if tmpDir == "" {
		return nil, nil
	}
	path := filepath.Join(tmpDir, stateFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, failure.SystemError(err, "reading job state")
	}
	var record stateRecord
	if err := json.Unmarshal(data, &record); err != nil {
		return nil, failure.SystemError(nil, "job state file %s is corrupt (%v): the runner's TMPDIR was changed behind its back", path, err)
	}
	if record.Version > stateVersion {
		return nil, failure.SystemError(nil, "job state file %s has version %d, this sandbox-executor reads up to %d: run one version of it per runner host", path, record.Version, stateVersion)
	}
	job := record.job()
	if job.Sandbox.Pod == "" || job.Sandbox.JobObject() != claimName {
		return nil, nil
	}
	return job, nil
}

// LoadJob finds the job's state: from prepare's state file when there is one, else by finding
// its sandbox again (find), with stages over exec.
func LoadJob(ctx context.Context, tmpDir, claimName string, find func(context.Context) (*kube.Sandbox, error)) (*JobState, error) {
	if saved, err := SavedJob(tmpDir, claimName); saved != nil || err != nil {
		return saved, err
	}
	sbx, err := find(ctx)
	if err != nil {
		return nil, err
	}
	return &JobState{Sandbox: sbx}, nil
}

// ForgetJob removes the state file after cleanup.
func ForgetJob(tmpDir string) {
	if tmpDir != "" {
		_ = os.Remove(filepath.Join(tmpDir, stateFile))
	}
}
