package fakegitlab

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ServeHTTP routes the GitLab API and records every request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	recorder := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	s.routes.ServeHTTP(recorder, r)

	s.mu.Lock()
	s.requests = append(s.requests, Request{Method: r.Method, Path: r.URL.Path, Status: recorder.status, At: time.Now()})
	s.mu.Unlock()
}

func (s *Server) newRouter() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/v4/runners/verify", s.verifyRunner)
	mux.HandleFunc("POST /api/v4/jobs/request", s.requestJob)
	mux.HandleFunc("PUT /api/v4/jobs/{id}", s.withJob(s.updateJob))
	mux.HandleFunc("PATCH /api/v4/jobs/{id}/trace", s.withJob(s.patchTrace))
	mux.HandleFunc("POST /api/v4/jobs/{id}/artifacts", s.withJob(s.uploadArtifacts))
	mux.HandleFunc("GET /api/v4/jobs/{id}/artifacts", s.withJob(s.downloadArtifacts))
	mux.HandleFunc("POST /api/v4/projects/{id}/merge_requests", s.createMergeRequest)
	return mux
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(status int) {
	r.status = status
	r.ResponseWriter.WriteHeader(status)
}

// Unwrap lets handlers mounted next to the API take over the connection (a WebSocket upgrade
// through http.ResponseController).
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

type runnerRequest struct {
	Token string        `json:"token"`
	Info  RunnerVersion `json:"info"`
}

// authenticateRunner decodes a runner's request and checks its token, answering the runner
// itself when either fails.
func (s *Server) authenticateRunner(w http.ResponseWriter, r *http.Request) (runnerRequest, bool) {
	var request runnerRequest
	if err := json.NewDecoder(r.Body).Decode(&request); err != nil {
		writeMessage(w, http.StatusBadRequest, "400 Bad request: "+err.Error())
		return request, false
	}
	if request.Token != s.runnerToken {
		writeMessage(w, http.StatusForbidden, "403 Forbidden")
		return request, false
	}
	return request, true
}

func (s *Server) verifyRunner(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.authenticateRunner(w, r); !ok {
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": 1, "token": s.runnerToken})
}

func (s *Server) requestJob(w http.ResponseWriter, r *http.Request) {
	request, ok := s.authenticateRunner(w, r)
	if !ok {
		return
	}

	deadline := time.Now().Add(s.longPoll)
	for {
		s.mu.Lock()
		if len(s.queue) > 0 {
			record := s.handOutLocked(s.queue[0], request.Info)
			s.mu.Unlock()

			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(record.payload)
			return
		}
		changed := s.changed
		s.mu.Unlock()

		remaining := time.Until(deadline)
		if remaining <= 0 {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		timer := time.NewTimer(remaining)
		select {
		case <-changed:
		case <-timer.C:
		case <-r.Context().Done():
		case <-s.closed:
		}
		timer.Stop()
		if r.Context().Err() != nil || isClosed(s.closed) {
			w.WriteHeader(http.StatusNoContent)
			return
		}
	}
}

func isClosed(channel <-chan struct{}) bool {
	select {
	case <-channel:
		return true
	default:
		return false
	}
}

// jobHandler serves a request about one job, with s.mu held and the job's
// token already checked.
type jobHandler func(w http.ResponseWriter, r *http.Request, record *jobRecord, body []byte)

// withJob resolves {id}, reads the body and checks the job token, which
// GitLab takes from the JOB-TOKEN header or, for state updates, from the
// JSON body's "token".
func (s *Server) withJob(handle jobHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		jobID, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
		if err != nil {
			writeMessage(w, http.StatusNotFound, "404 Not Found")
			return
		}
		// Read before taking the lock, so a slow artifacts upload does not
		// hold up the other jobs' trace patches.
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxArtifactBytes))
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				writeMessage(w, http.StatusRequestEntityTooLarge, "413 Request Entity Too Large")
				return
			}
			writeMessage(w, http.StatusBadRequest, "400 Bad request: "+err.Error())
			return
		}
		token := r.Header.Get("JOB-TOKEN")
		if token == "" {
			token = r.URL.Query().Get("job_token")
		}
		if token == "" && r.Method == http.MethodPut {
			var update struct {
				Token string `json:"token"`
			}
			_ = json.Unmarshal(body, &update)
			token = update.Token
		}

		s.mu.Lock()
		defer s.mu.Unlock()
		record, ok := s.jobs[jobID]
		if !ok {
			writeMessage(w, http.StatusNotFound, "404 Job Not Found")
			return
		}
		if token != record.job.Token {
			writeMessage(w, http.StatusForbidden, "403 Forbidden")
			return
		}
		handle(w, r, record, body)
	}
}

// acceptsRunnerUpdates tells whether GitLab still takes trace and state
// from a runner for this job: only while it runs (or is being canceled
// gracefully). Otherwise it answers 403 with the job's status, which is how
// a runner learns that the job was canceled.
func (r *jobRecord) acceptsRunnerUpdates() bool {
	return !r.done && (r.status == StateRunning || r.status == StateCanceling)
}

type updateJobRequest struct {
	State         string        `json:"state"`
	FailureReason string        `json:"failure_reason"`
	ExitCode      *int          `json:"exit_code"`
	Info          RunnerVersion `json:"info"`
}

func (s *Server) updateJob(w http.ResponseWriter, _ *http.Request, record *jobRecord, body []byte) {
	var update updateJobRequest
	if err := json.Unmarshal(body, &update); err != nil {
		writeMessage(w, http.StatusBadRequest, "400 Bad request: "+err.Error())
		return
	}
	if record.done || record.status == StatePending {
		w.Header().Set("Job-Status", record.status)
		writeMessage(w, http.StatusForbidden, "403 Forbidden - Job is not running")
		return
	}

	now := time.Now()
	accepted := record.acceptsRunnerUpdates()
	status := http.StatusOK
	if !accepted {
		status = http.StatusForbidden
	}
	record.updates = append(record.updates, StateUpdate{
		State: update.State, FailureReason: update.FailureReason, ExitCode: update.ExitCode, At: now, Status: status,
	})
	if update.State == StateSuccess || update.State == StateFailed {
		// Recorded even when refused, so a test sees what the runner
		// concluded about a canceled job.
		record.reportedState = update.State
		record.failureReason = update.FailureReason
		record.exitCode = update.ExitCode
		switch record.status {
		case StateRunning:
			record.status = update.State
		case StateCanceling:
			record.status = StateCanceled
		}
		record.finish(now)
	}
	s.notifyLocked()

	w.Header().Set("Job-Status", record.status)
	if !accepted {
		writeMessage(w, status, "403 Forbidden - Job is not running")
		return
	}
	writeJSON(w, status, map[string]string{})
}

func (s *Server) patchTrace(w http.ResponseWriter, r *http.Request, record *jobRecord, body []byte) {
	w.Header().Set("Job-Status", record.status)
	if !record.acceptsRunnerUpdates() {
		writeMessage(w, http.StatusForbidden, "403 Forbidden - Job is not running")
		return
	}
	start, end, err := parseContentRange(r.Header.Get("Content-Range"))
	if err != nil {
		writeMessage(w, http.StatusBadRequest, "400 Bad request: "+err.Error())
		return
	}
	// GitLab only appends: a patch must start where the stored log ends.
	// 416 plus the stored range tells the runner where to resume.
	if start != len(record.trace) {
		w.Header().Set("Range", fmt.Sprintf("0-%d", len(record.trace)))
		writeMessage(w, http.StatusRequestedRangeNotSatisfiable, "416 Range Not Satisfiable")
		return
	}
	if end-start+1 != len(body) {
		writeMessage(w, http.StatusBadRequest,
			fmt.Sprintf("400 Bad request: Content-Range %d-%d does not match a %d-byte body", start, end, len(body)))
		return
	}
	record.trace = append(record.trace, body...)
	s.notifyLocked()

	w.Header().Set("Range", fmt.Sprintf("0-%d", len(record.trace)))
	w.WriteHeader(http.StatusAccepted)
}

// parseContentRange parses the runner's "start-end" (inclusive byte offsets).
func parseContentRange(header string) (start, end int, err error) {
	first, last, found := strings.Cut(strings.TrimPrefix(header, "bytes "), "-")
	if !found {
		return 0, 0, fmt.Errorf("missing or malformed Content-Range %q", header)
	}
	if start, err = strconv.Atoi(first); err != nil {
		return 0, 0, fmt.Errorf("malformed Content-Range %q", header)
	}
	if end, err = strconv.Atoi(last); err != nil || start < 0 || end < start-1 {
		return 0, 0, fmt.Errorf("malformed Content-Range %q", header)
	}
	return start, end, nil
}

func (s *Server) uploadArtifacts(w http.ResponseWriter, r *http.Request, record *jobRecord, body []byte) {
	if !record.acceptsRunnerUpdates() {
		w.Header().Set("Job-Status", record.status)
		writeMessage(w, http.StatusForbidden, "403 Forbidden - Job is not running")
		return
	}
	filename, data, err := readMultipartFile(body, r.Header.Get("Content-Type"))
	if err != nil {
		writeMessage(w, http.StatusBadRequest, "400 Bad request: "+err.Error())
		return
	}
	query := r.URL.Query()
	artifact := UploadedArtifact{
		Filename:   filename,
		Type:       valueOr(query.Get("artifact_type"), artifactTypeArchive),
		Format:     valueOr(query.Get("artifact_format"), "zip"),
		ExpireIn:   query.Get("expire_in"),
		Data:       data,
		UploadedAt: time.Now(),
	}
	record.artifacts = append(record.artifacts, artifact)
	s.notifyLocked()
	writeJSON(w, http.StatusCreated, map[string]string{})
}

func readMultipartFile(body []byte, contentType string) (filename string, data []byte, err error) {
	request := &http.Request{Header: http.Header{"Content-Type": {contentType}}, Body: io.NopCloser(bytes.NewReader(body))}
	reader, err := request.MultipartReader()
	if err != nil {
		return "", nil, err
	}
	for {
		part, err := reader.NextPart()
		if err == io.EOF {
			return "", nil, errors.New(`no "file" part in the upload`)
		}
		if err != nil {
			return "", nil, err
		}
		if part.FormName() != "file" {
			continue
		}
		data, err := io.ReadAll(part)
		return part.FileName(), data, err
	}
}

func (s *Server) downloadArtifacts(w http.ResponseWriter, _ *http.Request, record *jobRecord, _ []byte) {
	archive := record.archive()
	if archive == nil {
		writeMessage(w, http.StatusNotFound, "404 Not Found")
		return
	}
	w.Header().Set("Content-Type", "application/zip")
	w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", archive.Filename))
	w.Header().Set("Content-Length", strconv.Itoa(len(archive.Data)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(archive.Data)
}

func valueOr(value, fallback string) string {
	if value == "" {
		return fallback
	}
	return value
}

func writeJSON(w http.ResponseWriter, status int, value any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(value)
}

// writeMessage answers like GitLab's API errors: {"message": "..."}.
func writeMessage(w http.ResponseWriter, status int, message string) {
	writeJSON(w, status, map[string]string{"message": message})
}
