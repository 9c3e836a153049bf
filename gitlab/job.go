// Package gitlab is the runner's side of the custom executor protocol: the job as GitLab sent it,
// what the runner passes every stage (exit codes, files, TMPDIR), and the job log's format.
// It knows nothing of Kubernetes.
package gitlab

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/sandbox-executor/sandbox-executor/failure"
)

// Job is what prepare needs to know about a job. It is read from $JOB_RESPONSE_FILE, the job
// JSON GitLab sent the runner: CUSTOM_ENV_* variables can be overridden by job variables, so
// they are never trusted for identity, timeout or image.
type Job struct {
	ID         int64
	ProjectID  int64
	PipelineID int64
	Image      string
	// Timeout is the job's timeout as GitLab set it (runner_info.timeout).
	Timeout time.Duration
	// NeedsHelper tells whether a stage will call the runner's helper binary in the pod: the
	// job has a cache, artifacts, or dependencies' artifacts to download. True when unknown.
	NeedsHelper bool
	// Token is the job's token: only this job has it, so what the job makes in the cluster is
	// bound to a keyed hash of it (kube.JobBinding). Never printed, never stored; empty when
	// unknown (runners without JOB_RESPONSE_FILE).
	Token string
	// ServerURL and ServerHost are the GitLab instance the job came from (CI_SERVER_URL,
	// CI_SERVER_HOST): the first of each in the job JSON. A job can define a variable of the same
	// name, but GitLab lists its predefined variables before every user-defined one
	// (Gitlab::Ci::Variables::Builder#scoped_variables: predefined, then the project's instance
	// and server variables, then YAML, pipeline, group and project variables), and the job JSON
	// has no other field that names the instance (git_info.repo_url follows the instance's
	// custom clone URL, when it has one). TestReadJobTakesTheInstanceGitLabListsFirst holds us
	// to taking the first.
	ServerURL  string
	ServerHost string
}

// archivePaths is a cache: or artifacts: entry; without paths or untracked, the runner skips it.
type archivePaths struct {
	Paths     []string `json:"paths"`
	Untracked bool     `json:"untracked"`
}

func anyArchive(entries []archivePaths) bool {
	for _, e := range entries {
		if len(e.Paths) > 0 || e.Untracked {
			return true
		}
	}
	return false
}

// jobResponse mirrors the parts of GitLab's job JSON that we read.
type jobResponse struct {
	ID      int64  `json:"id"`
	Token   string `json:"token"`
	JobInfo struct {
		ProjectID int64 `json:"project_id"`
	} `json:"job_info"`
	RunnerInfo struct {
		// Timeout is absent in a job JSON that predates it (nil: DefaultJobTimeout).
		Timeout *int64 `json:"timeout"`
	} `json:"runner_info"`
	Image struct {
		Name string `json:"name"`
	} `json:"image"`
	Variables []struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	} `json:"variables"`
	Cache        []archivePaths `json:"cache"`
	Artifacts    []archivePaths `json:"artifacts"`
	Dependencies []struct {
		ArtifactsFile struct {
			Filename string `json:"filename"`
		} `json:"artifacts_file"`
	} `json:"dependencies"`
}

// DefaultJobTimeout applies when the job JSON carries no timeout (GitLab's own default).
const DefaultJobTimeout = time.Hour

// MaxJobTimeout is the longest job timeout accepted: GitLab's own maximum (a month). The timeout
// becomes the claim's shutdownTime and the egress grant's lifetime, so a larger one (or one that
// overflows a time.Duration, 9223372037 s and up) would keep a sandbox and its grants for ever.
const MaxJobTimeout = 30 * 24 * time.Hour

// jobTimeout is a timeout of secs seconds from source, refused unless in (0, MaxJobTimeout].
func jobTimeout(secs int64, source string) (time.Duration, error) {
	if secs <= 0 || secs > int64(MaxJobTimeout/time.Second) {
		return 0, failure.PermanentError(nil, "%s is %d seconds: a job timeout must be between 1 second and %d (30 days); fix the job's or the project's timeout", source, secs, int64(MaxJobTimeout/time.Second))
	}
	return time.Duration(secs) * time.Second, nil
}

// ReadJob parses the job JSON at path. Errors never quote the file: it holds the job token.
func ReadJob(path string) (*Job, error) {
	if path == "" {
		return nil, failure.PermanentError(nil, "JOB_RESPONSE_FILE is not set: run this command from gitlab-runner's custom executor")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, failure.SystemError(nil, "reading JOB_RESPONSE_FILE %s: %v", path, failure.WithoutPath(err))
	}
	return parseJob(path, data)
}

// parseJob reads the job JSON data of the file at path (named in errors, never quoted).
func parseJob(path string, data []byte) (*Job, error) {
	var err error
	var resp jobResponse
	if err := json.Unmarshal(data, &resp); err != nil {
		return nil, failure.PermanentError(nil, "JOB_RESPONSE_FILE %s is not valid job JSON", path)
	}
	if resp.ID <= 0 {
		return nil, failure.PermanentError(nil, "JOB_RESPONSE_FILE %s has no job id", path)
	}
	job := &Job{ID: resp.ID, ProjectID: resp.JobInfo.ProjectID, Image: resp.Image.Name, Timeout: DefaultJobTimeout, Token: resp.Token}
	job.NeedsHelper = anyArchive(resp.Cache) || anyArchive(resp.Artifacts)
	for _, d := range resp.Dependencies {
		job.NeedsHelper = job.NeedsHelper || d.ArtifactsFile.Filename != ""
	}
	if resp.RunnerInfo.Timeout != nil {
		if job.Timeout, err = jobTimeout(*resp.RunnerInfo.Timeout, "runner_info.timeout in JOB_RESPONSE_FILE"); err != nil {
			return nil, err
		}
	}
	for _, v := range resp.Variables {
		switch v.Key {
		case "CI_PIPELINE_ID":
			job.PipelineID, _ = strconv.ParseInt(v.Value, 10, 64)
		case "CI_SERVER_URL":
			if job.ServerURL == "" {
				job.ServerURL = v.Value
			}
		case "CI_SERVER_HOST":
			if job.ServerHost == "" {
				job.ServerHost = v.Value
			}
		case "CI_PROJECT_ID":
			if job.ProjectID == 0 {
				job.ProjectID, _ = strconv.ParseInt(v.Value, 10, 64)
			}
		}
	}
	return job, nil
}

// JobFromEnv reads the job from CUSTOM_ENV_* variables, for runners older than 13 that write no
// JOB_RESPONSE_FILE. Job variables can override these, so on such runners a job could pick
// another job's claim name; modern runners never take this path. It reads no token: one a job
// variable could set binds nothing.
func JobFromEnv(getenv func(string) string) (*Job, error) {
	id, err := strconv.ParseInt(getenv("CUSTOM_ENV_CI_JOB_ID"), 10, 64)
	if err != nil || id <= 0 {
		return nil, failure.PermanentError(nil, "neither JOB_RESPONSE_FILE nor CUSTOM_ENV_CI_JOB_ID is set: run this command from gitlab-runner's custom executor")
	}
	job := &Job{ID: id, Image: getenv("CUSTOM_ENV_CI_JOB_IMAGE"), Timeout: DefaultJobTimeout, NeedsHelper: true}
	job.ProjectID, _ = strconv.ParseInt(getenv("CUSTOM_ENV_CI_PROJECT_ID"), 10, 64)
	job.PipelineID, _ = strconv.ParseInt(getenv("CUSTOM_ENV_CI_PIPELINE_ID"), 10, 64)
	if v := getenv("CUSTOM_ENV_CI_JOB_TIMEOUT"); v != "" {
		secs, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, failure.PermanentError(nil, "CUSTOM_ENV_CI_JOB_TIMEOUT %q is not a number of seconds", truncate(v, 40))
		}
		if job.Timeout, err = jobTimeout(secs, "CUSTOM_ENV_CI_JOB_TIMEOUT"); err != nil {
			return nil, err
		}
	}
	return job, nil
}

// RunnerEnv is what the runner tells every stage through its environment.
type RunnerEnv struct {
	BuildFailureExitCode  int
	SystemFailureExitCode int
	// BuildExitCodeFile receives the script's exit code (runner 17.9+); empty on older runners.
	BuildExitCodeFile string
	JobResponseFile   string
	// TmpDir is the runner's per-job temporary directory, shared by all stages of a job.
	TmpDir string
}

// RunnerEnvFrom reads the runner's variables, with the runner's defaults for missing exit codes.
func RunnerEnvFrom(getenv func(string) string) RunnerEnv {
	code := func(key string, def int) int {
		if v, err := strconv.Atoi(getenv(key)); err == nil {
			return v
		}
		return def
	}
	return RunnerEnv{
		BuildFailureExitCode:  code("BUILD_FAILURE_EXIT_CODE", 1),
		SystemFailureExitCode: code("SYSTEM_FAILURE_EXIT_CODE", 2),
		BuildExitCodeFile:     getenv("BUILD_EXIT_CODE_FILE"),
		JobResponseFile:       getenv("JOB_RESPONSE_FILE"),
		TmpDir:                getenv("TMPDIR"),
	}
}

// WriteBuildExitCode records a script's exit code where the runner reads it.
func (e RunnerEnv) WriteBuildExitCode(code int) error {
	if e.BuildExitCodeFile == "" {
		return nil
	}
	if err := os.WriteFile(e.BuildExitCodeFile, []byte(fmt.Sprintf("%d\n", code)), 0o600); err != nil {
		return failure.SystemError(err, "writing BUILD_EXIT_CODE_FILE")
	}
	return nil
}
