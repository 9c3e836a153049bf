package fakegitlab

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
)

// MergeRequest is a merge request opened through the API, and the job whose CI_JOB_TOKEN
// opened it.
type MergeRequest struct {
	IID          int64  `json:"iid"`
	ProjectID    int64  `json:"project_id"`
	SourceBranch string `json:"source_branch"`
	TargetBranch string `json:"target_branch"`
	Title        string `json:"title"`
	WebURL       string `json:"web_url"`
	// JobID is the running job whose token authenticated the request.
	JobID int64 `json:"-"`
}

// createMergeRequest answers POST /api/v4/projects/:id/merge_requests, authenticated like a
// job's API call: the JOB-TOKEN header holds the CI_JOB_TOKEN of a running job of that project.
func (s *Server) createMergeRequest(w http.ResponseWriter, r *http.Request) {
	projectID, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		writeMessage(w, http.StatusNotFound, "404 Project Not Found")
		return
	}
	token := r.Header.Get("JOB-TOKEN")
	s.mu.Lock()
	var jobID int64
	for id, record := range s.jobs {
		if token != "" && record.job.Token == token && record.acceptsRunnerUpdates() && record.job.JobInfo.ProjectID == projectID {
			jobID = id
		}
	}
	s.mu.Unlock()
	if jobID == 0 {
		writeMessage(w, http.StatusUnauthorized, "401 Unauthorized")
		return
	}
	var mr MergeRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&mr); err != nil || mr.SourceBranch == "" || mr.TargetBranch == "" || mr.Title == "" {
		writeMessage(w, http.StatusBadRequest, "400 Bad request - source_branch, target_branch and title are required")
		return
	}
	s.mu.Lock()
	mr.IID = int64(len(s.mergeRequests) + 1)
	mr.ProjectID, mr.JobID = projectID, jobID
	mr.WebURL = fmt.Sprintf("%s/projects/%d/-/merge_requests/%d", s.url, projectID, mr.IID)
	s.mergeRequests = append(s.mergeRequests, mr)
	s.mu.Unlock()
	writeJSON(w, http.StatusCreated, mr)
}

// MergeRequests lists the merge requests opened so far, oldest first.
func (s *Server) MergeRequests() []MergeRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]MergeRequest(nil), s.mergeRequests...)
}
