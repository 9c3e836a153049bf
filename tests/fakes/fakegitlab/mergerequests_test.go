package fakegitlab_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
)

func TestMergeRequestNeedsARunningJobsTokenOfTheProject(t *testing.T) {
	server, client := newServer(t)
	server.Enqueue(server.NewJob(fakegitlab.JobSpec{ProjectID: 7, Script: []string{"true"}}))
	_, job := client.requestJob(server.RunnerToken())
	body := `{"source_branch":"duo/x","target_branch":"main","title":"Duo: x"}`
	post := func(project, token, body string) *http.Response {
		return client.do(http.MethodPost, "projects/"+project+"/merge_requests", strings.NewReader(body), http.Header{"JOB-TOKEN": {token}, "Content-Type": {"application/json"}})
	}
	expectStatus(t, post("7", "wrong", body), http.StatusUnauthorized)
	expectStatus(t, post("8", job.Token, body), http.StatusUnauthorized) // another project
	expectStatus(t, post("7", job.Token, `{"title":"no branches"}`), http.StatusBadRequest)
	if n := len(server.MergeRequests()); n != 0 {
		t.Fatalf("%d merge requests after refused requests", n)
	}
	response := post("7", job.Token, body)
	expectStatus(t, response, http.StatusCreated)
	var mr fakegitlab.MergeRequest
	if err := json.NewDecoder(response.Body).Decode(&mr); err != nil {
		t.Fatal(err)
	}
	if mr.IID != 1 || mr.SourceBranch != "duo/x" || !strings.HasSuffix(mr.WebURL, "/projects/7/-/merge_requests/1") {
		t.Errorf("answered %+v", mr)
	}
	if got := server.MergeRequests(); len(got) != 1 || got[0].JobID != job.ID || got[0].Title != "Duo: x" {
		t.Errorf("recorded %+v, want one by job %d", got, job.ID)
	}
	// A finished job's token no longer works.
	expectStatus(t, client.updateState(job, "success", ""), http.StatusOK)
	expectStatus(t, post("7", job.Token, body), http.StatusUnauthorized)
}
