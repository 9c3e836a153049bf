package fakegitlab

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Job is the JSON document GitLab hands to a runner from POST /api/v4/jobs/request
// (the runner's JobResponse). Only the fields runners 12.8 to 19.x read are modelled.
type Job struct {
	ID            int64        `json:"id"`
	Token         string       `json:"token"`
	AllowGitFetch bool         `json:"allow_git_fetch"`
	JobInfo       JobInfo      `json:"job_info"`
	GitInfo       GitInfo      `json:"git_info"`
	RunnerInfo    RunnerInfo   `json:"runner_info"`
	Variables     []Variable   `json:"variables"`
	Steps         []Step       `json:"steps"`
	Image         Image        `json:"image"`
	Services      []Image      `json:"services"`
	Artifacts     []Artifact   `json:"artifacts"`
	Cache         []Cache      `json:"cache"`
	Dependencies  []Dependency `json:"dependencies"`
	Features      Features     `json:"features"`
}

// JobInfo names the job and its project.
type JobInfo struct {
	Name        string `json:"name"`
	Stage       string `json:"stage"`
	ProjectID   int64  `json:"project_id"`
	ProjectName string `json:"project_name"`
}

// GitInfo tells the runner what to check out in get_sources.
type GitInfo struct {
	RepoURL   string   `json:"repo_url"`
	Ref       string   `json:"ref"`
	Sha       string   `json:"sha"`
	BeforeSha string   `json:"before_sha"`
	RefType   string   `json:"ref_type"`
	Refspecs  []string `json:"refspecs"`
	Depth     int      `json:"depth"`
}

// RunnerInfo carries the job timeout in seconds.
type RunnerInfo struct {
	Timeout int `json:"timeout"`
}

// Variable is one CI/CD variable.
type Variable struct {
	Key      string `json:"key"`
	Value    string `json:"value"`
	Public   bool   `json:"public"`
	Internal bool   `json:"internal,omitempty"`
	File     bool   `json:"file"`
	Masked   bool   `json:"masked"`
	Raw      bool   `json:"raw,omitempty"`
}

// Step is one script section of the job ("script" or "after_script").
type Step struct {
	Name         string   `json:"name"`
	Script       []string `json:"script"`
	Timeout      int      `json:"timeout"`
	When         string   `json:"when"`
	AllowFailure bool     `json:"allow_failure"`
}

// Step names and "when" values GitLab uses.
const (
	StepNameScript      = "script"
	StepNameAfterScript = "after_script"

	WhenOnSuccess = "on_success"
	WhenOnFailure = "on_failure"
	WhenAlways    = "always"
)

// Image is the job's `image:` (or one of its `services:`).
type Image struct {
	Name       string   `json:"name"`
	Alias      string   `json:"alias,omitempty"`
	Command    []string `json:"command,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
}

// Artifact is one `artifacts:` definition.
type Artifact struct {
	Name      string   `json:"name"`
	Untracked bool     `json:"untracked"`
	Paths     []string `json:"paths"`
	Exclude   []string `json:"exclude,omitempty"`
	When      string   `json:"when"`
	Type      string   `json:"artifact_type"`
	Format    string   `json:"artifact_format"`
	ExpireIn  string   `json:"expire_in"`
}

// Cache is one `cache:` definition.
type Cache struct {
	Key       string   `json:"key"`
	Untracked bool     `json:"untracked"`
	Policy    string   `json:"policy"`
	Paths     []string `json:"paths"`
	When      string   `json:"when,omitempty"`
}

// Dependency is an earlier job whose artifacts this job downloads in
// download_artifacts. Runners skip dependencies without an artifacts file name.
type Dependency struct {
	ID            int64                   `json:"id"`
	Token         string                  `json:"token"`
	Name          string                  `json:"name"`
	ArtifactsFile DependencyArtifactsFile `json:"artifacts_file"`
}

// DependencyArtifactsFile describes the archive a Dependency uploaded.
type DependencyArtifactsFile struct {
	Filename string `json:"filename"`
	Size     int64  `json:"size"`
}

// Features are GitLab-side switches the runner honours.
type Features struct {
	TraceSections bool `json:"trace_sections"`
	// FailureReasons are the failure reasons GitLab accepts in a final state update; a runner
	// (>= 13.x) sends unknown_failure for any other (always including script_failure,
	// runner_system_failure and job_execution_timeout).
	FailureReasons []string `json:"failure_reasons,omitempty"`
}

// Failure reasons in a runner's final state update (failure_reason).
const (
	FailureScript            = "script_failure"
	FailureSystem            = "runner_system_failure"
	FailureTimeout           = "job_execution_timeout"
	FailureUnknown           = "unknown_failure"
	FailureAPI               = "api_failure"
	FailureStuckOrTimeout    = "stuck_or_timeout_failure"
	FailureMissingDependency = "missing_dependency_failure"
)

// supportedFailureReasons are the failure reasons the fake announces, as GitLab announces the
// build failure reasons it knows (these are some of them). job_canceled is not one: it is
// internal to the runner, which reports a canceled job as unknown_failure.
var supportedFailureReasons = []string{
	FailureUnknown, FailureScript, FailureAPI, FailureStuckOrTimeout, FailureSystem, FailureMissingDependency, FailureTimeout,
}

// Variable returns the value of the job variable key (the last one wins, as
// in the runner) and whether it is set.
func (j Job) Variable(key string) (string, bool) {
	value, found := "", false
	for _, variable := range j.Variables {
		if variable.Key == key {
			value, found = variable.Value, true
		}
	}
	return value, found
}

// JobSpec describes a job the way a .gitlab-ci.yml and its project would;
// NewJob turns it into the Job GitLab would send. Zero fields get defaults.
type JobSpec struct {
	// ID is the job ID; 0 takes the next one from a process-wide counter, so
	// jobs built in parallel tests never collide.
	ID          int64
	Name        string // default "test"
	Stage       string // default "test"
	ProjectID   int64  // default 1
	ProjectPath string // "namespace/name", default "sandbox/hello"
	PipelineID  int64  // default 100 + ID

	// ServerURL is GitLab's URL as seen by the job (CI_SERVER_URL and the
	// URLs derived from it). Server.NewJob fills it in.
	ServerURL string
	RepoURL   string // default CI_REPOSITORY_URL: <ServerURL>/<ProjectPath>.git with the job token
	Ref       string // default "main"
	SHA       string // default a fixed 40-hex commit id

	Image       string
	Services    []Image
	Script      []string
	AfterScript []string

	// GitStrategy, when set, adds the GIT_STRATEGY variable (none, fetch, clone, empty).
	GitStrategy string
	// Variables are appended after the predefined ones, so they override them
	// as project and job variables do in GitLab.
	Variables []Variable
	// Tags are the runner tags the job asked for (CI_RUNNER_TAGS).
	Tags []string
	// Timeout is runner_info.timeout; default 10 minutes.
	Timeout time.Duration

	Cache        []Cache
	Artifacts    []Artifact
	Dependencies []Dependency
}

const (
	defaultServerURL   = "http://127.0.0.1"
	defaultProjectPath = "sandbox/hello"
	defaultRef         = "main"
	defaultSHA         = "1f6c3a7de1d4c6b0a9e3f15b2a4c8e7d9b0a1c2d"
	defaultBeforeSHA   = "0000000000000000000000000000000000000000"
	defaultJobTimeout  = 10 * time.Minute
	firstJobID         = 1000
)

var jobsNumbered atomic.Int64

// NextJobID returns a job ID that no other call in this process returns.
func NextJobID() int64 { return firstJobID + jobsNumbered.Add(1) - 1 }

// NewJob builds the job JSON GitLab would hand out for spec, including the
// predefined variables GitLab (not the runner) supplies: CI_JOB_ID,
// CI_JOB_TOKEN, CI_PROJECT_*, CI_PIPELINE_*, CI_COMMIT_*, CI_SERVER_*,
// CI_RUNNER_TAGS and so on.
func NewJob(spec JobSpec) Job {
	spec = spec.withDefaults()
	token := newJobToken(spec.ID)
	serverURL := strings.TrimRight(spec.ServerURL, "/")
	projectURL := serverURL + "/" + spec.ProjectPath
	repoURL := spec.RepoURL
	if repoURL == "" {
		repoURL = withUserInfo(projectURL+".git", "gitlab-ci-token", token)
	}
	timeoutSeconds := int(spec.Timeout / time.Second)

	job := Job{
		ID:            spec.ID,
		Token:         token,
		AllowGitFetch: true,
		JobInfo: JobInfo{
			Name:        spec.Name,
			Stage:       spec.Stage,
			ProjectID:   spec.ProjectID,
			ProjectName: path.Base(spec.ProjectPath),
		},
		GitInfo: GitInfo{
			RepoURL:   repoURL,
			Ref:       spec.Ref,
			Sha:       spec.SHA,
			BeforeSha: defaultBeforeSHA,
			RefType:   "branch",
			Refspecs:  []string{"+refs/heads/" + spec.Ref + ":refs/remotes/origin/" + spec.Ref},
			Depth:     20,
		},
		RunnerInfo:   RunnerInfo{Timeout: timeoutSeconds},
		Image:        Image{Name: spec.Image},
		Services:     spec.Services,
		Artifacts:    spec.Artifacts,
		Cache:        spec.Cache,
		Dependencies: spec.Dependencies,
		Features:     Features{TraceSections: true, FailureReasons: slices.Clone(supportedFailureReasons)},
	}
	job.Variables = append(predefinedVariables(spec, token, serverURL, projectURL, repoURL), spec.Variables...)
	if spec.GitStrategy != "" {
		job.Variables = append(job.Variables, Variable{Key: "GIT_STRATEGY", Value: spec.GitStrategy, Public: true})
	}
	// GitLab turns a GIT_DEPTH variable into git_info.depth, which is all runners before 15.x read.
	if value, ok := job.Variable("GIT_DEPTH"); ok {
		if depth, err := strconv.Atoi(value); err == nil && depth >= 0 {
			job.GitInfo.Depth = depth
		}
	}

	job.Steps = []Step{{
		Name: StepNameScript, Script: spec.Script, Timeout: timeoutSeconds, When: WhenOnSuccess,
	}}
	if len(spec.AfterScript) > 0 {
		job.Steps = append(job.Steps, Step{
			Name: StepNameAfterScript, Script: spec.AfterScript, Timeout: timeoutSeconds, When: WhenAlways,
		})
	}
	return job
}

func (spec JobSpec) withDefaults() JobSpec {
	if spec.ID == 0 {
		spec.ID = NextJobID()
	}
	if spec.Name == "" {
		spec.Name = "test"
	}
	if spec.Stage == "" {
		spec.Stage = "test"
	}
	if spec.ProjectID == 0 {
		spec.ProjectID = 1
	}
	if spec.ProjectPath == "" {
		spec.ProjectPath = defaultProjectPath
	}
	if spec.PipelineID == 0 {
		spec.PipelineID = 100 + spec.ID
	}
	if spec.ServerURL == "" {
		spec.ServerURL = defaultServerURL
	}
	if spec.Ref == "" {
		spec.Ref = defaultRef
	}
	if spec.SHA == "" {
		spec.SHA = defaultSHA
	}
	if spec.Timeout <= 0 {
		spec.Timeout = defaultJobTimeout
	}
	return spec
}

func predefinedVariables(spec JobSpec, token, serverURL, projectURL, repoURL string) []Variable {
	server, err := url.Parse(serverURL)
	if err != nil {
		server = &url.URL{} // a malformed ServerURL only leaves the CI_SERVER_* parts empty
	}
	namespace := path.Dir(spec.ProjectPath)
	tags, _ := json.Marshal(append([]string{}, spec.Tags...))
	jobID := strconv.FormatInt(spec.ID, 10)
	pipelineID := strconv.FormatInt(spec.PipelineID, 10)

	public := func(key, value string) Variable { return Variable{Key: key, Value: value, Public: true} }
	return []Variable{
		public("CI_PIPELINE_ID", pipelineID),
		public("CI_PIPELINE_IID", strconv.FormatInt(spec.PipelineID%1000, 10)),
		public("CI_PIPELINE_SOURCE", "push"),
		public("CI_PIPELINE_URL", projectURL+"/-/pipelines/"+pipelineID),
		public("CI_JOB_ID", jobID),
		public("CI_JOB_URL", projectURL+"/-/jobs/"+jobID),
		{Key: "CI_JOB_TOKEN", Value: token, Masked: true},
		public("CI_JOB_NAME", spec.Name),
		public("CI_JOB_NAME_SLUG", slug(spec.Name)),
		public("CI_JOB_STAGE", spec.Stage),
		public("CI_NODE_TOTAL", "1"),
		public("CI", "true"),
		public("GITLAB_CI", "true"),
		public("CI_SERVER_URL", serverURL),
		public("CI_SERVER_HOST", server.Hostname()),
		public("CI_SERVER_PORT", serverPort(server)),
		public("CI_SERVER_PROTOCOL", server.Scheme),
		public("CI_SERVER_NAME", "GitLab"),
		public("CI_API_V4_URL", serverURL+"/api/v4"),
		public("CI_PROJECT_ID", strconv.FormatInt(spec.ProjectID, 10)),
		public("CI_PROJECT_NAME", path.Base(spec.ProjectPath)),
		public("CI_PROJECT_TITLE", path.Base(spec.ProjectPath)),
		public("CI_PROJECT_PATH", spec.ProjectPath),
		public("CI_PROJECT_PATH_SLUG", slug(spec.ProjectPath)),
		public("CI_PROJECT_NAMESPACE", namespace),
		public("CI_PROJECT_ROOT_NAMESPACE", strings.SplitN(namespace, "/", 2)[0]),
		public("CI_PROJECT_URL", projectURL),
		public("CI_PROJECT_VISIBILITY", "private"),
		public("CI_DEFAULT_BRANCH", defaultRef),
		public("CI_COMMIT_SHA", spec.SHA),
		public("CI_COMMIT_SHORT_SHA", spec.SHA[:min(8, len(spec.SHA))]),
		public("CI_COMMIT_BEFORE_SHA", defaultBeforeSHA),
		public("CI_COMMIT_REF_NAME", spec.Ref),
		public("CI_COMMIT_REF_SLUG", slug(spec.Ref)),
		public("CI_COMMIT_BRANCH", spec.Ref),
		{Key: "CI_REPOSITORY_URL", Value: repoURL},
		public("CI_RUNNER_TAGS", string(tags)),
		public("GITLAB_USER_ID", "1"),
		public("GITLAB_USER_LOGIN", "root"),
	}
}

var nonSlugCharacters = regexp.MustCompile(`[^a-z0-9]+`)

// slug mimics GitLab's *_SLUG variables: lower case, runs of anything but
// [a-z0-9] replaced by "-", trimmed, at most 63 bytes.
func slug(s string) string {
	s = nonSlugCharacters.ReplaceAllString(strings.ToLower(s), "-")
	if len(s) > 63 {
		s = s[:63]
	}
	return strings.Trim(s, "-")
}

func serverPort(server *url.URL) string {
	if port := server.Port(); port != "" {
		return port
	}
	if server.Scheme == "https" {
		return "443"
	}
	return "80"
}

func withUserInfo(rawURL, user, password string) string {
	parsed, err := url.Parse(rawURL)
	if err != nil {
		return rawURL
	}
	parsed.User = url.UserPassword(user, password)
	return parsed.String()
}

func newJobToken(jobID int64) string {
	random := make([]byte, 10)
	_, _ = rand.Read(random) // crypto/rand.Read never fails on Linux
	return fmt.Sprintf("glcbt-%d_%s", jobID, hex.EncodeToString(random))
}
