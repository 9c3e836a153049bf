package fakegitlab_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
)

func TestNewJobCarriesWhatGitLabSends(t *testing.T) {
	job := fakegitlab.NewJob(fakegitlab.JobSpec{
		ID:          2001,
		ProjectID:   42,
		ProjectPath: "group/sub/project",
		PipelineID:  77,
		ServerURL:   "http://127.0.0.1:8080",
		Image:       "alpine:3.20",
		Script:      []string{"echo hello"},
		AfterScript: []string{"echo bye"},
		GitStrategy: "none",
		Tags:        []string{"sandbox", "gvisor"},
		Timeout:     90 * time.Second,
		Variables:   []fakegitlab.Variable{{Key: "CI_PROJECT_PATH", Value: "overridden", Public: true}},
		Cache:       []fakegitlab.Cache{{Key: "deps", Paths: []string{"vendor/"}, Policy: "pull-push"}},
		Artifacts:   []fakegitlab.Artifact{{Name: "out", Paths: []string{"out/"}, When: fakegitlab.WhenOnSuccess, Format: "zip", Type: "archive"}},
	})

	if job.ID != 2001 || job.Token == "" || job.RunnerInfo.Timeout != 90 {
		t.Errorf("id %d token %q timeout %d", job.ID, job.Token, job.RunnerInfo.Timeout)
	}
	if job.Image.Name != "alpine:3.20" {
		t.Errorf("image %+v", job.Image)
	}
	// Like GitLab, the job announces the failure reasons it accepts; without them a runner
	// would report anything but script_failure, runner_system_failure and
	// job_execution_timeout as unknown_failure.
	for _, reason := range []string{fakegitlab.FailureScript, fakegitlab.FailureSystem, fakegitlab.FailureTimeout, fakegitlab.FailureUnknown} {
		if !slices.Contains(job.Features.FailureReasons, reason) {
			t.Errorf("features.failure_reasons %q lacks %s", job.Features.FailureReasons, reason)
		}
	}
	wantVariables := map[string]string{
		"CI_JOB_ID":        "2001",
		"CI_PROJECT_ID":    "42",
		"CI_PIPELINE_ID":   "77",
		"CI_PROJECT_PATH":  "overridden", // spec variables come last and win
		"CI_RUNNER_TAGS":   `["sandbox","gvisor"]`,
		"CI_SERVER_URL":    "http://127.0.0.1:8080",
		"CI_API_V4_URL":    "http://127.0.0.1:8080/api/v4",
		"CI_PROJECT_NAME":  "project",
		"CI_JOB_TOKEN":     job.Token,
		"GIT_STRATEGY":     "none",
		"CI_SERVER_PORT":   "8080",
		"CI_COMMIT_SHA":    job.GitInfo.Sha,
		"CI_PROJECT_URL":   "http://127.0.0.1:8080/group/sub/project",
		"CI_JOB_NAME_SLUG": "test",
	}
	for key, want := range wantVariables {
		if got, _ := job.Variable(key); got != want {
			t.Errorf("%s = %q, want %q", key, got, want)
		}
	}
	if !strings.Contains(job.GitInfo.RepoURL, "gitlab-ci-token:"+job.Token+"@127.0.0.1:8080/group/sub/project.git") {
		t.Errorf("repo URL %q", job.GitInfo.RepoURL)
	}
	if len(job.Steps) != 2 || job.Steps[0].Name != "script" || job.Steps[1].Name != "after_script" || job.Steps[1].When != "always" {
		t.Errorf("steps %+v", job.Steps)
	}

	encoded, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{`"git_info":`, `"runner_info":{"timeout":90}`, `"steps":`, `"image":{"name":"alpine:3.20"}`, `"cache":[{"key":"deps"`, `"artifact_format":"zip"`} {
		if !strings.Contains(string(encoded), field) {
			t.Errorf("job JSON lacks %s: %s", field, encoded)
		}
	}
}

func TestNewJobDefaultsGiveUniqueIDsAndTokens(t *testing.T) {
	first := fakegitlab.NewJob(fakegitlab.JobSpec{})
	second := fakegitlab.NewJob(fakegitlab.JobSpec{})
	if first.ID == second.ID || first.Token == second.Token {
		t.Errorf("jobs share id %d/%d or token", first.ID, second.ID)
	}
	if len(first.Steps) != 1 || first.RunnerInfo.Timeout != 600 {
		t.Errorf("defaults: steps %+v timeout %d", first.Steps, first.RunnerInfo.Timeout)
	}
	if _, found := first.Variable("GIT_STRATEGY"); found {
		t.Error("GIT_STRATEGY set without being asked for")
	}
}

func TestGitDepthVariableSetsGitInfoDepth(t *testing.T) {
	if depth := fakegitlab.NewJob(fakegitlab.JobSpec{}).GitInfo.Depth; depth != 20 {
		t.Errorf("default depth %d, want GitLab's 20", depth)
	}
	job := fakegitlab.NewJob(fakegitlab.JobSpec{Variables: []fakegitlab.Variable{{Key: "GIT_DEPTH", Value: "1", Public: true}}})
	if job.GitInfo.Depth != 1 {
		t.Errorf("GIT_DEPTH=1: git_info.depth %d, want 1", job.GitInfo.Depth)
	}
}
