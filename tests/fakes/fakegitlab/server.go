// Package fakegitlab is a fake of the part of the GitLab API that a runner
// uses, served on a random loopback port, so tests can drive a real
// gitlab-runner (`run-single`) without a GitLab instance.
//
// It serves:
//
//	POST  /api/v4/runners/verify          runner token check
//	POST  /api/v4/jobs/request            201 + job JSON for the next queued job, else 204
//	PUT   /api/v4/jobs/:id                job state updates ("running", final "success"/"failed")
//	PATCH /api/v4/jobs/:id/trace          appends to the job log, honouring Content-Range
//	POST  /api/v4/jobs/:id/artifacts      artifacts-uploader (multipart "file"), stored in memory
//	GET   /api/v4/jobs/:id/artifacts      artifacts-downloader
//	POST  /api/v4/projects/:id/merge_requests  a running job of the project opens a merge request (JOB-TOKEN header)
//
// plus whatever Handle mounts next to the API (repositories, a package registry...). New listens
// on loopback; WithListener takes an address job environments reach too.
//
// A job is handed out as 201 + Content-Type: application/json, the only answer
// runner 17.x accepts; the job JSON announces the failure reasons GitLab knows
// (Features.FailureReasons).
//
// Cancellation follows GitLab: after Cancel, trace patches and state updates
// are refused with 403 and "Job-Status: canceled", which a runner treats as
// an abort. CancelGracefully answers "Job-Status: canceling" instead: runner
// 17.x then sends SIGTERM to the running stage and still runs after_script
// with CI_JOB_STATUS=canceled. Either way the runner only hears of it in the
// answer to its next trace patch (sent every 3 s while there is new output)
// or keep-alive update (every 30-63 s for a silent job).
package fakegitlab

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Job states as GitLab reports them in the Job-Status header and Result.State.
const (
	StatePending   = "pending"
	StateRunning   = "running"
	StateSuccess   = "success"
	StateFailed    = "failed"
	StateCanceling = "canceling"
	StateCanceled  = "canceled"
)

// DefaultRunnerToken is the runner authentication token New accepts unless
// WithRunnerToken says otherwise.
const DefaultRunnerToken = "glrt-fake-runner-token"

// defaultMaxArtifactBytes bounds one artifacts upload; it is all kept in memory.
const defaultMaxArtifactBytes = 64 << 20

// Server is a fake GitLab. Create it with New and stop it with Close.
type Server struct {
	runnerToken      string
	longPoll         time.Duration
	maxArtifactBytes int64
	listener         net.Listener
	tlsCert          *tls.Certificate

	routes     *http.ServeMux
	httpServer *http.Server
	url        string
	closed     chan struct{}
	closeOnce  sync.Once

	mu       sync.Mutex
	queue    []int64 // IDs of pending jobs, first handed out first
	jobs     map[int64]*jobRecord
	changed  chan struct{} // closed and replaced on every change, to wake waiters
	requests []Request
	// mergeRequests opened through the API (mergerequests.go).
	mergeRequests []MergeRequest
}

// Option configures a Server.
type Option func(*Server)

// WithRunnerToken sets the runner token that jobs/request and runners/verify accept.
func WithRunnerToken(token string) Option {
	return func(s *Server) { s.runnerToken = token }
}

// WithLongPolling makes POST /jobs/request wait up to d for a job to be
// enqueued before answering 204, as GitLab Workhorse does. Without it a
// runner that polled an empty queue sleeps its whole check interval (3 s in
// a runner) before asking again, which would swamp any latency measurement.
func WithLongPolling(d time.Duration) Option {
	return func(s *Server) { s.longPoll = d }
}

// WithListener serves on listener instead of a random loopback port: an address that job
// environments reach too, for jobs that clone, upload artifacts or push back.
func WithListener(listener net.Listener) Option {
	return func(s *Server) { s.listener = listener }
}

// WithTLS serves HTTPS with cert, as a self-managed instance with its own CA does; the URL is
// then https://.
func WithTLS(cert tls.Certificate) Option {
	return func(s *Server) { s.tlsCert = &cert }
}

// New starts a fake GitLab on 127.0.0.1 with a random port. Like
// httptest.NewServer it panics if it cannot listen.
func New(options ...Option) *Server {
	s := &Server{
		runnerToken:      DefaultRunnerToken,
		maxArtifactBytes: defaultMaxArtifactBytes,
		closed:           make(chan struct{}),
		jobs:             make(map[int64]*jobRecord),
		changed:          make(chan struct{}),
	}
	for _, option := range options {
		option(s)
	}
	s.routes = s.newRouter()

	listener := s.listener
	if listener == nil {
		var err error
		if listener, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			panic(fmt.Sprintf("fakegitlab: listening on loopback: %v", err))
		}
	}
	s.url = "http://" + strings.TrimSuffix(listener.Addr().String(), ":80")
	if s.tlsCert != nil {
		listener = tls.NewListener(listener, &tls.Config{Certificates: []tls.Certificate{*s.tlsCert}, MinVersion: tls.VersionTLS12})
		s.url = "https://" + strings.TrimSuffix(listener.Addr().String(), ":443")
	}
	s.httpServer = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.httpServer.Serve(listener) }()
	return s
}

// URL is the base URL to give a runner (--url), without /api/v4.
func (s *Server) URL() string { return s.url }

// Handle serves pattern (http.ServeMux syntax) with handler next to the API, as a GitLab
// instance serves its repositories and more on the same host.
func (s *Server) Handle(pattern string, handler http.Handler) { s.routes.Handle(pattern, handler) }

// ValidJobToken tells whether token is the CI_JOB_TOKEN of a job that is running, which GitLab
// accepts (user gitlab-ci-token) to clone the job's project.
func (s *Server) ValidJobToken(token string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, record := range s.jobs {
		if record.job.Token == token && record.acceptsRunnerUpdates() {
			return true
		}
	}
	return false
}

// RunnerToken is the token a runner must present (--token).
func (s *Server) RunnerToken() string { return s.runnerToken }

// Close stops the server and releases long-polling requests.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.closed)
		_ = s.httpServer.Close()
	})
}

// NewJob is NewJob with the server's URL filled in, so the job's
// CI_SERVER_URL, CI_API_V4_URL and repository URL point at this server.
func (s *Server) NewJob(spec JobSpec) Job {
	if spec.ServerURL == "" {
		spec.ServerURL = s.url
	}
	return NewJob(spec)
}

// Enqueue queues job to be handed out by POST /jobs/request, after the jobs
// queued before it, and returns its ID. Job IDs must be unique per server.
func (s *Server) Enqueue(job Job) int64 {
	payload, err := json.Marshal(job)
	if err != nil {
		panic(fmt.Sprintf("fakegitlab: encoding job %d: %v", job.ID, err)) // only plain data types: cannot happen
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if _, exists := s.jobs[job.ID]; exists {
		panic(fmt.Sprintf("fakegitlab: job %d enqueued twice", job.ID))
	}
	s.jobs[job.ID] = &jobRecord{job: job, payload: payload, status: StatePending}
	s.queue = append(s.queue, job.ID)
	s.notifyLocked()
	return job.ID
}

// HandOut takes queued job jobID off the queue as if a runner had requested
// it, for tests that drive a job without a runner's POST /jobs/request, so
// that its trace, state updates and artifact uploads are accepted.
func (s *Server) HandOut(jobID int64, runner RunnerVersion) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	record, ok := s.jobs[jobID]
	if !ok {
		return fmt.Errorf("fakegitlab: no job %d", jobID)
	}
	if record.status != StatePending || record.done {
		return fmt.Errorf("fakegitlab: job %d is %s, not pending", jobID, record.status)
	}
	s.handOutLocked(jobID, runner)
	return nil
}

func (s *Server) handOutLocked(jobID int64, runner RunnerVersion) *jobRecord {
	s.queue = slices.DeleteFunc(s.queue, func(id int64) bool { return id == jobID })
	record := s.jobs[jobID]
	record.status = StateRunning
	record.handedOutAt = time.Now()
	record.runner = runner
	s.notifyLocked()
	return record
}

// Cancel cancels a job as GitLab's cancel button does. A queued job is
// dropped from the queue and finishes as canceled at once. For a running
// job, the next trace patch or state update is refused with 403 and
// "Job-Status: canceled"; the job finishes when the runner sends its final
// state. A runner only patches the trace when there is new output, and
// otherwise sends a keep-alive update every 30 s or more, so a silent job
// notices a cancel late.
func (s *Server) Cancel(jobID int64) error {
	return s.requestCancel(jobID, StateCanceled)
}

// CancelGracefully answers trace patches and state updates of a running job
// with "Job-Status: canceling", GitLab's graceful cancel: runner 17.x then
// stops the script, still runs after_script (CI_JOB_STATUS=canceled) and
// reports the job as failed with unknown_failure (job_canceled is internal to
// the runner), which the fake records as canceled.
func (s *Server) CancelGracefully(jobID int64) error {
	return s.requestCancel(jobID, StateCanceling)
}

func (s *Server) requestCancel(jobID int64, status string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	record, ok := s.jobs[jobID]
	switch {
	case !ok:
		return fmt.Errorf("fakegitlab: no job %d", jobID)
	case record.done:
		return fmt.Errorf("fakegitlab: job %d already finished as %s", jobID, record.status)
	case record.status == StatePending:
		s.queue = slices.DeleteFunc(s.queue, func(id int64) bool { return id == jobID })
		record.status = StateCanceled
		record.finish(time.Now())
	default:
		record.status = status
	}
	record.cancelRequested = true
	s.notifyLocked()
	return nil
}

// Wait blocks until the job has finished (the runner sent a final state, or
// it was canceled before being handed out) and returns its result. When ctx
// ends first it returns what is known so far together with ctx's error, so
// a test can show the partial trace.
func (s *Server) Wait(ctx context.Context, jobID int64) (Result, error) {
	return s.waitUntil(ctx, jobID, func(record *jobRecord) bool { return record.done })
}

// WaitForTrace blocks until the job's trace contains text (or the job has
// finished without it, which is an error), e.g. to cancel a job once its
// script is known to be running.
func (s *Server) WaitForTrace(ctx context.Context, jobID int64, text string) (Result, error) {
	result, err := s.waitUntil(ctx, jobID, func(record *jobRecord) bool {
		return record.done || strings.Contains(string(record.trace), text)
	})
	if err == nil && !strings.Contains(result.Trace, text) {
		err = fmt.Errorf("fakegitlab: job %d finished as %s without %q in its trace", jobID, result.State, text)
	}
	return result, err
}

// Snapshot returns the job's result so far.
func (s *Server) Snapshot(jobID int64) (Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	record, ok := s.jobs[jobID]
	if !ok {
		return Result{}, fmt.Errorf("fakegitlab: no job %d", jobID)
	}
	return record.result(), nil
}

func (s *Server) waitUntil(ctx context.Context, jobID int64, condition func(*jobRecord) bool) (Result, error) {
	for {
		s.mu.Lock()
		record, ok := s.jobs[jobID]
		if !ok {
			s.mu.Unlock()
			return Result{}, fmt.Errorf("fakegitlab: no job %d", jobID)
		}
		if condition(record) {
			result := record.result()
			s.mu.Unlock()
			return result, nil
		}
		changed := s.changed
		s.mu.Unlock()

		select {
		case <-changed:
		case <-ctx.Done():
			result, _ := s.Snapshot(jobID)
			return result, fmt.Errorf("fakegitlab: waiting for job %d (state %s): %w", jobID, result.State, ctx.Err())
		}
	}
}

// SeedArtifacts registers job as an already finished job whose artifacts
// archive is archive (a zip), and returns the Dependency a later job lists
// to download it, without running job through a runner.
func (s *Server) SeedArtifacts(job Job, archive []byte) Dependency {
	now := time.Now()
	record := &jobRecord{job: job, status: StateSuccess, reportedState: StateSuccess, handedOutAt: now}
	record.finish(now)
	record.artifacts = []UploadedArtifact{{
		Filename: "artifacts.zip", Type: artifactTypeArchive, Format: "zip", Data: archive, UploadedAt: now,
	}}

	s.mu.Lock()
	defer s.mu.Unlock()
	if _, exists := s.jobs[job.ID]; exists {
		panic(fmt.Sprintf("fakegitlab: job %d seeded twice", job.ID))
	}
	s.jobs[job.ID] = record
	s.notifyLocked()
	return record.dependency()
}

// Dependency returns the Dependency a later job lists to download the
// artifacts archive that job jobID uploaded.
func (s *Server) Dependency(jobID int64) (Dependency, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	record, ok := s.jobs[jobID]
	if !ok {
		return Dependency{}, fmt.Errorf("fakegitlab: no job %d", jobID)
	}
	if record.archive() == nil {
		return Dependency{}, fmt.Errorf("fakegitlab: job %d uploaded no artifacts archive", jobID)
	}
	return record.dependency(), nil
}

// Requests lists the requests served so far, oldest first.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

func (s *Server) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}
