package fakegitlab

import (
	"slices"
	"time"
)

// Request is one request the server answered.
type Request struct {
	Method string
	Path   string
	Status int
	At     time.Time
}

// Result is what GitLab knows about a job.
type Result struct {
	JobID int64
	// State is the job's state as GitLab shows it: pending, running,
	// canceling, then success, failed or canceled.
	State string
	// ReportedState is the final state in the runner's last update, even when
	// GitLab refused it because the job was canceled; empty if none came.
	ReportedState string
	FailureReason string
	// ExitCode is the script's exit code; only runners >= 15.x send it.
	ExitCode *int
	// Trace is the whole job log the runner sent.
	Trace string
	// HandedOutAt is when POST /jobs/request handed the job to a runner.
	HandedOutAt time.Time
	// FinishedAt is when the final state arrived (or a queued job was canceled).
	FinishedAt      time.Time
	CancelRequested bool
	// Runner is how the runner that took the job described itself.
	Runner    RunnerVersion
	Updates   []StateUpdate
	Artifacts []UploadedArtifact
}

// Duration is the time from hand-out to final state: the latency a GitLab
// user sees for the job once a runner picked it up.
func (r Result) Duration() time.Duration {
	if r.HandedOutAt.IsZero() || r.FinishedAt.IsZero() {
		return 0
	}
	return r.FinishedAt.Sub(r.HandedOutAt)
}

// RunnerVersion is the "info" a runner sends with its requests.
type RunnerVersion struct {
	Name         string `json:"name"`
	Version      string `json:"version"`
	Revision     string `json:"revision"`
	Platform     string `json:"platform"`
	Architecture string `json:"architecture"`
	Executor     string `json:"executor"`
	Shell        string `json:"shell"`
}

// StateUpdate is one PUT /jobs/:id the runner sent.
type StateUpdate struct {
	State         string
	FailureReason string
	ExitCode      *int
	At            time.Time
	// Status is the HTTP status the server answered with.
	Status int
}

// UploadedArtifact is one artifacts upload.
type UploadedArtifact struct {
	Filename   string
	Type       string // artifact_type: "archive" for artifacts:paths, "junit", ...
	Format     string // artifact_format: zip, gzip, raw
	ExpireIn   string
	Data       []byte
	UploadedAt time.Time
}

const artifactTypeArchive = "archive"

type jobRecord struct {
	job     Job
	payload []byte

	status          string
	cancelRequested bool
	done            bool
	handedOutAt     time.Time
	finishedAt      time.Time

	runner        RunnerVersion
	reportedState string
	failureReason string
	exitCode      *int
	updates       []StateUpdate
	trace         []byte
	artifacts     []UploadedArtifact
}

func (r *jobRecord) finish(at time.Time) {
	r.done = true
	r.finishedAt = at
}

func (r *jobRecord) archive() *UploadedArtifact {
	for i := range r.artifacts {
		if r.artifacts[i].Type == artifactTypeArchive {
			return &r.artifacts[i]
		}
	}
	return nil
}

func (r *jobRecord) dependency() Dependency {
	dependency := Dependency{ID: r.job.ID, Token: r.job.Token, Name: r.job.JobInfo.Name}
	if archive := r.archive(); archive != nil {
		dependency.ArtifactsFile = DependencyArtifactsFile{Filename: archive.Filename, Size: int64(len(archive.Data))}
	}
	return dependency
}

func (r *jobRecord) result() Result {
	return Result{
		JobID:           r.job.ID,
		State:           r.status,
		ReportedState:   r.reportedState,
		FailureReason:   r.failureReason,
		ExitCode:        r.exitCode,
		Trace:           string(r.trace),
		HandedOutAt:     r.handedOutAt,
		FinishedAt:      r.finishedAt,
		CancelRequested: r.cancelRequested,
		Runner:          r.runner,
		Updates:         slices.Clone(r.updates),
		Artifacts:       slices.Clone(r.artifacts),
	}
}
