package fakegitlab_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
)

// runnerClient speaks to the fake the way gitlab-runner does.
type runnerClient struct {
	t      *testing.T
	server *fakegitlab.Server
}

func newServer(t *testing.T, options ...fakegitlab.Option) (*fakegitlab.Server, runnerClient) {
	t.Helper()
	server := fakegitlab.New(options...)
	t.Cleanup(server.Close)
	return server, runnerClient{t: t, server: server}
}

func (c runnerClient) do(method, path string, body io.Reader, header http.Header) *http.Response {
	c.t.Helper()
	request, err := http.NewRequest(method, c.server.URL()+"/api/v4/"+path, body)
	if err != nil {
		c.t.Fatal(err)
	}
	for key, values := range header {
		request.Header[key] = values
	}
	response, err := http.DefaultClient.Do(request)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = response.Body.Close() })
	return response
}

func (c runnerClient) requestJob(token string) (*http.Response, fakegitlab.Job) {
	c.t.Helper()
	body := fmt.Sprintf(`{"token":%q,"info":{"name":"gitlab-runner","version":"17.9.0","executor":"custom"}}`, token)
	response := c.do(http.MethodPost, "jobs/request", strings.NewReader(body), http.Header{"Content-Type": {"application/json"}})
	var job fakegitlab.Job
	if response.StatusCode == http.StatusCreated {
		if err := json.NewDecoder(response.Body).Decode(&job); err != nil {
			c.t.Fatal(err)
		}
	}
	return response, job
}

func (c runnerClient) patchTrace(job fakegitlab.Job, offset int, text string) *http.Response {
	c.t.Helper()
	header := http.Header{
		"Job-Token":     {job.Token},
		"Content-Range": {fmt.Sprintf("%d-%d", offset, offset+len(text)-1)},
		"Content-Type":  {"text/plain"},
	}
	return c.do(http.MethodPatch, fmt.Sprintf("jobs/%d/trace", job.ID), strings.NewReader(text), header)
}

func (c runnerClient) updateState(job fakegitlab.Job, state, failureReason string) *http.Response {
	c.t.Helper()
	body := fmt.Sprintf(`{"token":%q,"state":%q,"failure_reason":%q}`, job.Token, state, failureReason)
	return c.do(http.MethodPut, fmt.Sprintf("jobs/%d", job.ID), strings.NewReader(body), http.Header{"Content-Type": {"application/json"}})
}

func expectStatus(t *testing.T, response *http.Response, want int) {
	t.Helper()
	if response.StatusCode != want {
		body, _ := io.ReadAll(response.Body)
		t.Fatalf("%s %s: status %d, want %d (body %s)", response.Request.Method, response.Request.URL.Path, response.StatusCode, want, body)
	}
}

func waitContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestRequestJobHandsOutQueuedJobsOnceInOrder(t *testing.T) {
	server, client := newServer(t)

	response, _ := client.requestJob(server.RunnerToken())
	expectStatus(t, response, http.StatusNoContent)

	first := server.Enqueue(server.NewJob(fakegitlab.JobSpec{Script: []string{"echo first"}}))
	second := server.Enqueue(server.NewJob(fakegitlab.JobSpec{Script: []string{"echo second"}}))

	for _, want := range []int64{first, second} {
		response, job := client.requestJob(server.RunnerToken())
		expectStatus(t, response, http.StatusCreated)
		if got := response.Header.Get("Content-Type"); got != "application/json" {
			t.Errorf("Content-Type %q, want application/json (runner 17.9 refuses anything else)", got)
		}
		if job.ID != want {
			t.Errorf("handed out job %d, want %d", job.ID, want)
		}
	}
	response, _ = client.requestJob(server.RunnerToken())
	expectStatus(t, response, http.StatusNoContent)

	result, err := server.Snapshot(first)
	if err != nil {
		t.Fatal(err)
	}
	if result.State != fakegitlab.StateRunning || result.HandedOutAt.IsZero() {
		t.Errorf("after hand-out: state %q, handed out at %v", result.State, result.HandedOutAt)
	}
	if result.Runner.Version != "17.9.0" || result.Runner.Executor != "custom" {
		t.Errorf("runner info not recorded: %+v", result.Runner)
	}
}

func TestRequestJobRejectsWrongRunnerToken(t *testing.T) {
	server, client := newServer(t, fakegitlab.WithRunnerToken("right"))
	server.Enqueue(server.NewJob(fakegitlab.JobSpec{Script: []string{"true"}}))

	response, _ := client.requestJob("wrong")
	expectStatus(t, response, http.StatusForbidden)

	response = client.do(http.MethodPost, "runners/verify", strings.NewReader(`{"token":"right"}`), nil)
	expectStatus(t, response, http.StatusOK)
}

func TestLongPollingHandsOutAJobEnqueuedWhileWaiting(t *testing.T) {
	// A long poll far longer than the bound below: only the enqueue can end the request in time.
	server, client := newServer(t, fakegitlab.WithLongPolling(time.Minute))
	job := server.NewJob(fakegitlab.JobSpec{Script: []string{"true"}})

	time.AfterFunc(100*time.Millisecond, func() { server.Enqueue(job) })
	started := time.Now()
	response, handedOut := client.requestJob(server.RunnerToken())
	expectStatus(t, response, http.StatusCreated)
	if handedOut.ID != job.ID {
		t.Errorf("handed out %d, want %d", handedOut.ID, job.ID)
	}
	if elapsed := time.Since(started); elapsed > 30*time.Second {
		t.Errorf("long poll answered after %v, want soon after the enqueue", elapsed)
	}
}

func TestJobLifecycleRecordsTraceStateAndTimes(t *testing.T) {
	server, client := newServer(t)
	jobID := server.Enqueue(server.NewJob(fakegitlab.JobSpec{Script: []string{"echo hello"}}))
	_, job := client.requestJob(server.RunnerToken())

	expectStatus(t, client.updateState(job, "running", ""), http.StatusOK)
	response := client.patchTrace(job, 0, "hello\n")
	expectStatus(t, response, http.StatusAccepted)
	if got := response.Header.Get("Range"); got != "0-6" {
		t.Errorf("Range %q, want 0-6", got)
	}
	if got := response.Header.Get("Job-Status"); got != "running" {
		t.Errorf("Job-Status %q, want running", got)
	}
	expectStatus(t, client.patchTrace(job, 6, "Job succeeded\n"), http.StatusAccepted)
	response = client.updateState(job, "success", "")
	expectStatus(t, response, http.StatusOK)

	result, err := server.Wait(waitContext(t), jobID)
	if err != nil {
		t.Fatal(err)
	}
	if result.State != fakegitlab.StateSuccess || result.ReportedState != fakegitlab.StateSuccess {
		t.Errorf("state %q reported %q, want success", result.State, result.ReportedState)
	}
	if result.Trace != "hello\nJob succeeded\n" {
		t.Errorf("trace %q", result.Trace)
	}
	if result.FinishedAt.Before(result.HandedOutAt) || result.Duration() <= 0 {
		t.Errorf("handed out %v, finished %v", result.HandedOutAt, result.FinishedAt)
	}
	if len(result.Updates) != 2 || result.Updates[0].State != "running" {
		t.Errorf("updates %+v", result.Updates)
	}

	// A finished job takes no more updates, as in GitLab.
	expectStatus(t, client.patchTrace(job, len(result.Trace), "late"), http.StatusForbidden)
}

func TestFailedJobKeepsFailureReasonAndExitCode(t *testing.T) {
	server, client := newServer(t)
	jobID := server.Enqueue(server.NewJob(fakegitlab.JobSpec{Script: []string{"exit 3"}}))
	_, job := client.requestJob(server.RunnerToken())

	body := fmt.Sprintf(`{"token":%q,"state":"failed","failure_reason":"script_failure","exit_code":3}`, job.Token)
	expectStatus(t, client.do(http.MethodPut, fmt.Sprintf("jobs/%d", jobID), strings.NewReader(body), nil), http.StatusOK)

	result, err := server.Wait(waitContext(t), jobID)
	if err != nil {
		t.Fatal(err)
	}
	if result.State != fakegitlab.StateFailed || result.FailureReason != "script_failure" {
		t.Errorf("state %q reason %q", result.State, result.FailureReason)
	}
	if result.ExitCode == nil || *result.ExitCode != 3 {
		t.Errorf("exit code %v, want 3", result.ExitCode)
	}
}

func TestTracePatchMustContinueWhereTheLogEnds(t *testing.T) {
	server, client := newServer(t)
	server.Enqueue(server.NewJob(fakegitlab.JobSpec{Script: []string{"true"}}))
	_, job := client.requestJob(server.RunnerToken())
	expectStatus(t, client.patchTrace(job, 0, "abc"), http.StatusAccepted)

	response := client.patchTrace(job, 10, "xyz")
	expectStatus(t, response, http.StatusRequestedRangeNotSatisfiable)
	if got := response.Header.Get("Range"); got != "0-3" {
		t.Errorf("Range %q, want 0-3 so the runner resumes at byte 3", got)
	}

	missingRange := http.Header{"Job-Token": {job.Token}}
	expectStatus(t, client.do(http.MethodPatch, fmt.Sprintf("jobs/%d/trace", job.ID), strings.NewReader("x"), missingRange), http.StatusBadRequest)

	wrongToken := job
	wrongToken.Token = "not-the-job-token"
	expectStatus(t, client.patchTrace(wrongToken, 3, "x"), http.StatusForbidden)
	expectStatus(t, client.updateState(wrongToken, "success", ""), http.StatusForbidden)

	result, _ := server.Snapshot(job.ID)
	if result.Trace != "abc" {
		t.Errorf("rejected patches changed the trace to %q", result.Trace)
	}
}

func TestCancelRunningJobAbortsTheRunner(t *testing.T) {
	server, client := newServer(t)
	jobID := server.Enqueue(server.NewJob(fakegitlab.JobSpec{Script: []string{"sleep 600"}}))
	_, job := client.requestJob(server.RunnerToken())
	expectStatus(t, client.patchTrace(job, 0, "sleeping\n"), http.StatusAccepted)

	if err := server.Cancel(jobID); err != nil {
		t.Fatal(err)
	}
	// A runner aborts on 403 or on Job-Status canceled/failed.
	response := client.patchTrace(job, 9, "more\n")
	expectStatus(t, response, http.StatusForbidden)
	if got := response.Header.Get("Job-Status"); got != "canceled" {
		t.Errorf("Job-Status %q, want canceled", got)
	}
	expectStatus(t, client.updateState(job, "failed", "script_failure"), http.StatusForbidden)

	result, err := server.Wait(waitContext(t), jobID)
	if err != nil {
		t.Fatal(err)
	}
	if result.State != fakegitlab.StateCanceled || result.ReportedState != fakegitlab.StateFailed || !result.CancelRequested {
		t.Errorf("state %q reported %q cancel %v", result.State, result.ReportedState, result.CancelRequested)
	}
	if err := server.Cancel(jobID); err == nil {
		t.Error("canceling a finished job succeeded")
	}
}

func TestCancelGracefullyAnswersCanceling(t *testing.T) {
	server, client := newServer(t)
	jobID := server.Enqueue(server.NewJob(fakegitlab.JobSpec{Script: []string{"sleep 600"}}))
	_, job := client.requestJob(server.RunnerToken())

	if err := server.CancelGracefully(jobID); err != nil {
		t.Fatal(err)
	}
	response := client.patchTrace(job, 0, "after_script output\n")
	expectStatus(t, response, http.StatusAccepted)
	if got := response.Header.Get("Job-Status"); got != "canceling" {
		t.Errorf("Job-Status %q, want canceling", got)
	}
	expectStatus(t, client.updateState(job, "failed", "job_canceled"), http.StatusOK)

	result, err := server.Wait(waitContext(t), jobID)
	if err != nil {
		t.Fatal(err)
	}
	if result.State != fakegitlab.StateCanceled || result.Trace != "after_script output\n" {
		t.Errorf("state %q trace %q", result.State, result.Trace)
	}
}

func TestCancelQueuedJobNeverHandsItOut(t *testing.T) {
	server, client := newServer(t)
	jobID := server.Enqueue(server.NewJob(fakegitlab.JobSpec{Script: []string{"true"}}))
	if err := server.Cancel(jobID); err != nil {
		t.Fatal(err)
	}
	response, _ := client.requestJob(server.RunnerToken())
	expectStatus(t, response, http.StatusNoContent)

	result, err := server.Wait(waitContext(t), jobID)
	if err != nil {
		t.Fatal(err)
	}
	if result.State != fakegitlab.StateCanceled || !result.HandedOutAt.IsZero() {
		t.Errorf("state %q handed out %v", result.State, result.HandedOutAt)
	}
}

func TestWaitReturnsPartialResultWhenContextEnds(t *testing.T) {
	server, client := newServer(t)
	jobID := server.Enqueue(server.NewJob(fakegitlab.JobSpec{Script: []string{"sleep 600"}}))
	_, job := client.requestJob(server.RunnerToken())
	client.patchTrace(job, 0, "still going")

	if _, err := server.WaitForTrace(waitContext(t), jobID, "going"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	result, err := server.Wait(ctx, jobID)
	if err == nil {
		t.Fatal("Wait on a running job returned without error")
	}
	if result.Trace != "still going" || result.State != fakegitlab.StateRunning {
		t.Errorf("partial result: state %q trace %q", result.State, result.Trace)
	}
	if _, err := server.Wait(ctx, 424242); err == nil {
		t.Error("Wait on an unknown job succeeded")
	}
}

func TestArtifactsUploadThenDownloadAsDependency(t *testing.T) {
	server, client := newServer(t)
	producerID := server.Enqueue(server.NewJob(fakegitlab.JobSpec{Name: "build", Script: []string{"make"}}))
	_, producer := client.requestJob(server.RunnerToken())

	archive := []byte("PK\x03\x04 pretend zip")
	var form bytes.Buffer
	writer := multipart.NewWriter(&form)
	part, _ := writer.CreateFormFile("file", "artifacts.zip")
	_, _ = part.Write(archive)
	_ = writer.Close()
	upload := client.do(http.MethodPost, fmt.Sprintf("jobs/%d/artifacts?artifact_format=zip&artifact_type=archive&expire_in=1+day", producerID),
		&form, http.Header{"Job-Token": {producer.Token}, "Content-Type": {writer.FormDataContentType()}})
	expectStatus(t, upload, http.StatusCreated)
	expectStatus(t, client.updateState(producer, "success", ""), http.StatusOK)

	dependency, err := server.Dependency(producerID)
	if err != nil {
		t.Fatal(err)
	}
	if dependency.ArtifactsFile.Filename != "artifacts.zip" || dependency.ArtifactsFile.Size != int64(len(archive)) {
		t.Errorf("dependency %+v", dependency)
	}
	result, _ := server.Snapshot(producerID)
	if len(result.Artifacts) != 1 || result.Artifacts[0].ExpireIn != "1 day" || result.Artifacts[0].Format != "zip" {
		t.Errorf("artifacts %+v", result.Artifacts)
	}

	download := client.do(http.MethodGet, fmt.Sprintf("jobs/%d/artifacts", producerID), nil, http.Header{"Job-Token": {dependency.Token}})
	expectStatus(t, download, http.StatusOK)
	if got, _ := io.ReadAll(download.Body); !bytes.Equal(got, archive) {
		t.Errorf("downloaded %q", got)
	}
	expectStatus(t, client.do(http.MethodGet, fmt.Sprintf("jobs/%d/artifacts", producerID), nil, http.Header{"Job-Token": {"wrong"}}), http.StatusForbidden)
}

func TestSeedArtifactsServesADependencyWithoutARunner(t *testing.T) {
	server, client := newServer(t)
	upstream := server.NewJob(fakegitlab.JobSpec{Name: "compile"})
	dependency := server.SeedArtifacts(upstream, []byte("zip bytes"))
	if dependency.ID != upstream.ID || dependency.Name != "compile" || dependency.ArtifactsFile.Filename == "" {
		t.Errorf("dependency %+v", dependency)
	}
	download := client.do(http.MethodGet, fmt.Sprintf("jobs/%d/artifacts", upstream.ID), nil, http.Header{"Job-Token": {dependency.Token}})
	expectStatus(t, download, http.StatusOK)
}

func TestServeHTTPRecordsEveryRequest(t *testing.T) {
	server := fakegitlab.New()
	t.Cleanup(server.Close)

	recorder := httptest.NewRecorder()
	server.ServeHTTP(recorder, httptest.NewRequest(http.MethodGet, "/api/v4/projects", nil))
	if recorder.Code != http.StatusNotFound {
		t.Errorf("unknown endpoint answered %d", recorder.Code)
	}
	recorder = httptest.NewRecorder()
	server.ServeHTTP(recorder, httptest.NewRequest(http.MethodPost, "/api/v4/jobs/request",
		strings.NewReader(fmt.Sprintf(`{"token":%q}`, server.RunnerToken()))))
	if recorder.Code != http.StatusNoContent {
		t.Errorf("empty queue answered %d", recorder.Code)
	}

	requests := server.Requests()
	if len(requests) != 2 || requests[0].Status != http.StatusNotFound || requests[1].Path != "/api/v4/jobs/request" {
		t.Errorf("requests %+v", requests)
	}
}

func TestConcurrentRunnersNeverShareAJob(t *testing.T) {
	server, _ := newServer(t)
	const jobs = 20
	for range jobs {
		server.Enqueue(server.NewJob(fakegitlab.JobSpec{Script: []string{"true"}}))
	}
	handedOut := make(chan int64, 2*jobs)
	done := make(chan struct{})
	for range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for {
				recorder := httptest.NewRecorder()
				server.ServeHTTP(recorder, httptest.NewRequest(http.MethodPost, "/api/v4/jobs/request",
					strings.NewReader(fmt.Sprintf(`{"token":%q}`, server.RunnerToken()))))
				if recorder.Code != http.StatusCreated {
					return
				}
				var job fakegitlab.Job
				_ = json.Unmarshal(recorder.Body.Bytes(), &job)
				handedOut <- job.ID
			}
		}()
	}
	for range 4 {
		<-done
	}
	close(handedOut)
	seen := map[int64]bool{}
	for id := range handedOut {
		if seen[id] {
			t.Errorf("job %d handed out twice", id)
		}
		seen[id] = true
	}
	if len(seen) != jobs {
		t.Errorf("handed out %d jobs, want %d", len(seen), jobs)
	}
}

func TestHandOutLetsADriverWithoutRunnerReportAJob(t *testing.T) {
	server, client := newServer(t)
	job := server.NewJob(fakegitlab.JobSpec{Script: []string{"true"}})
	server.Enqueue(job)

	if err := server.HandOut(job.ID, fakegitlab.RunnerVersion{Name: "direct-driver"}); err != nil {
		t.Fatal(err)
	}
	if err := server.HandOut(job.ID, fakegitlab.RunnerVersion{}); err == nil {
		t.Error("handing out a job twice succeeded")
	}
	response, _ := client.requestJob(server.RunnerToken())
	expectStatus(t, response, http.StatusNoContent)
	expectStatus(t, client.patchTrace(job, 0, "ok"), http.StatusAccepted)
	result, _ := server.Snapshot(job.ID)
	if result.State != fakegitlab.StateRunning || result.Runner.Name != "direct-driver" {
		t.Errorf("state %q runner %+v", result.State, result.Runner)
	}
}

// A GitLab instance serves more than the API on its host (repositories, ...), and accepts a
// job's token only while the job runs.
func TestListenerHandlersAndJobTokens(t *testing.T) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	server, client := newServer(t, fakegitlab.WithListener(listener))
	if server.URL() != "http://"+listener.Addr().String() {
		t.Errorf("URL %s, want the given listener's %s", server.URL(), listener.Addr())
	}
	server.Handle("/sandbox/hello.git/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "repo "+r.URL.Path) }))
	response, err := http.Get(server.URL() + "/sandbox/hello.git/info/refs")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(response.Body)
	response.Body.Close()
	if string(body) != "repo /sandbox/hello.git/info/refs" {
		t.Errorf("mounted handler answered %q", body)
	}

	job := server.NewJob(fakegitlab.JobSpec{Script: []string{"true"}})
	server.Enqueue(job)
	if server.ValidJobToken(job.Token) {
		t.Error("the token of a job still queued is valid")
	}
	client.requestJob(fakegitlab.DefaultRunnerToken)
	if !server.ValidJobToken(job.Token) || server.ValidJobToken("glcbt-forged") || server.ValidJobToken("") {
		t.Error("while the job runs, its token (and only its token) must be valid")
	}
	expectStatus(t, client.updateState(job, fakegitlab.StateSuccess, ""), http.StatusOK)
	if server.ValidJobToken(job.Token) {
		t.Error("the token of a finished job is still valid")
	}
}
