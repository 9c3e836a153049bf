package modern

import (
	"encoding/json"
	"net/url"
	"os"
	"path"
	"runtime"
	"strconv"
	"strings"

	"github.com/sandbox-executor/sandbox-executor/tests/fakegitlab"
)

// variables is a job's variable list; like the runner's, later entries win.
type variables []fakegitlab.Variable

func (vs *variables) add(key, value string) {
	*vs = append(*vs, fakegitlab.Variable{Key: key, Value: value, Public: true, Internal: true})
}

func (vs variables) get(key string) string {
	for i := len(vs) - 1; i >= 0; i-- {
		if vs[i].Key == key {
			return vs[i].Value
		}
	}
	return ""
}

// overwrite replaces every entry of key, as the runner does for CI_JOB_STATUS
// before after_script.
func (vs variables) overwrite(key, value string) variables {
	result := make(variables, 0, len(vs)+1)
	for _, variable := range vs {
		if variable.Key != key {
			result = append(result, variable)
		}
	}
	result.add(key, value)
	return result
}

// expand resolves $VAR and ${VAR} in every non-raw value against the whole
// list, once, like spec.Variables.Expand; unknown variables become empty.
func (vs variables) expand() variables {
	expanded := make(variables, len(vs))
	for i, variable := range vs {
		if !variable.Raw {
			variable.Value = os.Expand(variable.Value, vs.get)
		}
		expanded[i] = variable
	}
	return expanded
}

// ImitatedRunnerVersion is the CI_RUNNER_VERSION the modern driver reports:
// the protocol it imitates is that of gitlab-runner 17.9.
const ImitatedRunnerVersion = "17.9.0"

// allVariables imitates Build.GetAllVariables of runners 17.x-19.x: the
// runner's own variables around the job's, then expanded. Feature flag
// defaults are left out; a job that sets FF_* still passes them on.
func (d *driver) allVariables() variables {
	var all variables
	if image := d.job.Image.Name; image != "" {
		all.add("CI_JOB_IMAGE", image)
	}
	all.add("CI_RUNNER_SHORT_TOKEN", shortToken(d.config.Token))
	for _, assignment := range d.config.Environment {
		if key, value, ok := strings.Cut(assignment, "="); ok {
			all.add(key, value)
		}
	}
	all.add("CI_BUILDS_DIR", d.dirs.builds)
	all.add("CI_PROJECT_DIR", d.dirs.project)
	all.add("CI_CONCURRENT_ID", "0")
	all.add("CI_CONCURRENT_PROJECT_ID", "0")
	all.add("CI_SERVER", "yes")
	all.add("CI_JOB_STATUS", fakegitlab.StateRunning)
	all.add("CI_JOB_TIMEOUT", strconv.Itoa(int(jobTimeout(d.job).Seconds())))

	all = append(all, d.job.Variables...)

	// The custom executor declares the "shared" feature.
	all.add("CI_SHARED_ENVIRONMENT", "true")
	all.add("CI_RUNNER_VERSION", ImitatedRunnerVersion)
	all.add("CI_RUNNER_REVISION", "modern-driver")
	all.add("CI_RUNNER_EXECUTABLE_ARCH", runtime.GOOS+"/"+runtime.GOARCH)
	all.add("RUNNER_TEMP_PROJECT_DIR", d.dirs.tmpProject())

	if d.jobStatus != "" {
		all = all.overwrite("CI_JOB_STATUS", d.jobStatus)
	}
	return all.expand()
}

// servicesVariable is CUSTOM_ENV_CI_JOB_SERVICES: the job's services as JSON,
// empty without services.
func (d *driver) servicesVariable() string {
	if len(d.job.Services) == 0 {
		return ""
	}
	type service struct {
		Name       string   `json:"name"`
		Alias      string   `json:"alias"`
		Entrypoint []string `json:"entrypoint"`
		Command    []string `json:"command"`
	}
	services := make([]service, 0, len(d.job.Services))
	for _, image := range d.job.Services {
		services = append(services, service{Name: image.Name, Alias: image.Alias, Entrypoint: image.Entrypoint, Command: image.Command})
	}
	encoded, _ := json.Marshal(services) // plain strings: cannot fail
	return string(encoded)
}

// shortToken is the runner's ShortDescription: the token without its glrt-
// prefix, cut to 9 characters.
func shortToken(token string) string {
	token = strings.TrimPrefix(token, "glrt-")
	return token[:min(9, len(token))]
}

// buildDirs are the job's directories inside the job environment; they are
// known once config_exec has answered (Build.StartBuild).
type buildDirs struct {
	builds, cache   string // builds_dir and cache_dir
	project         string // CI_PROJECT_DIR
	projectCache    string // where this project's cache archives live
	sharedBuildsDir bool
}

func (dirs buildDirs) tmpProject() string {
	if dirs.project == "" {
		return ""
	}
	return dirs.project + ".tmp"
}

// projectUniqueDir imitates Build.ProjectUniqueDir: the repository path from
// the repo URL, under <short token>/<concurrent id> when builds_dir is
// shared, with "-empty" for GIT_STRATEGY=empty.
func projectUniqueDir(job fakegitlab.Job, runnerToken string, shared bool, gitStrategy string) string {
	dir := "project-" + strconv.FormatInt(job.JobInfo.ProjectID, 10)
	if repo, err := url.Parse(job.GitInfo.RepoURL); err == nil && repo.Host != "" {
		slug := path.Clean(strings.TrimSuffix(repo.Path, ".git"))
		if slug != "." && slug != "/" && !strings.Contains(slug, "..") {
			dir = slug
		}
	}
	if shared {
		dir = path.Join(shortToken(runnerToken), "0", dir)
	}
	if gitStrategy == gitStrategyEmpty {
		dir += "-empty"
	}
	return dir
}
