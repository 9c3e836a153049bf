//go:build e2e

package e2e

import (
	"archive/zip"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/tests/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/fakenpm"
	"github.com/sandbox-executor/sandbox-executor/tests/fakes3"
	"github.com/sandbox-executor/sandbox-executor/tests/gitserver"
	"github.com/sandbox-executor/sandbox-executor/tests/localcluster"
	"github.com/sandbox-executor/sandbox-executor/tests/runner"
)

const (
	duoProject     = "duo/todo-app"
	duoGitUser     = "duo-workflow"
	duoCacheKey    = "duo-node-modules"
	duoDependency  = "tiny-greet"
	cacheBucket    = "runner-cache"
	cacheAccessKey = "AKIDDUOE2ECACHE"
)

// instance is the GitLab instance of a Duo flow, as far as a job sees it, on one address of the
// instance network that job pods may reach (port 80): the API (jobs, trace, artifacts), the
// project's repository over smart HTTP, the runner's S3 cache and an npm registry.
type instance struct {
	gitlab      *fakegitlab.Server
	repos       *gitserver.Server
	cache       *fakes3.Server
	npm         *fakenpm.Registry
	host        string
	gitPassword string
}

func newInstance(t *testing.T) *instance {
	t.Helper()
	listener, err := localcluster.ListenOnInstanceNetwork()
	if err != nil {
		t.Fatal(err)
	}
	inst := &instance{
		gitlab:      fakegitlab.New(fakegitlab.WithLongPolling(2*time.Second), fakegitlab.WithListener(listener)),
		cache:       fakes3.New(cacheBucket, cacheAccessKey, "duo-e2e-cache-secret-key"),
		gitPassword: "duo-e2e-git-password-" + fmt.Sprint(time.Now().UnixNano()),
	}
	t.Cleanup(inst.gitlab.Close)
	inst.host = strings.TrimPrefix(inst.gitlab.URL(), "http://")
	// Like GitLab: a running job's token clones its project; only the workflow's own credentials push.
	inst.repos, err = gitserver.New(t.TempDir(), func(user, password, repo string, access gitserver.Access) bool {
		switch {
		case repo != duoProject:
			return false
		case user == "gitlab-ci-token":
			return access == gitserver.Fetch && inst.gitlab.ValidJobToken(password)
		default:
			return user == duoGitUser && password == inst.gitPassword
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	inst.npm, err = fakenpm.New("/npm/", fakenpm.Package{Name: duoDependency, Version: "1.4.0", Files: map[string]string{
		"index.js": "module.exports = name => 'Hello, ' + name + '!'\n",
	}})
	if err != nil {
		t.Fatal(err)
	}
	inst.gitlab.Handle("/"+duoProject+".git/", inst.repos)
	inst.gitlab.Handle("/"+cacheBucket+"/", inst.cache)
	inst.gitlab.Handle("/npm/", inst.npm)
	return inst
}

// createProject pushes the project a flow works on: a small Node.js app with a dependency and
// tests, whose .npmrc points npm at the instance's registry.
func (inst *instance) createProject(t *testing.T) string {
	t.Helper()
	sha, err := inst.repos.CreateRepo(duoProject, "main", map[string]string{
		"README.md": "# todo-app\n\nA small app the Duo flow works on.\n",
		".npmrc":    "registry=" + inst.gitlab.URL() + "/npm/\naudit=false\nfund=false\nupdate-notifier=false\n",
		"package.json": `{
  "name": "todo-app",
  "version": "1.0.0",
  "private": true,
  "scripts": {"test": "node test.js"},
  "dependencies": {"` + duoDependency + `": "^1.0.0"}
}
`,
		"index.js": "const greet = require('" + duoDependency + "')\n\nmodule.exports = {\n  welcome: name => greet(name),\n}\n",
		"test.js":  "const assert = require('assert')\nconst app = require('./index')\n\nassert.strictEqual(app.welcome('Duo'), 'Hello, Duo!')\nconsole.log('tests passed:', Object.keys(app).join(', '))\n",
	})
	if err != nil {
		t.Fatal(err)
	}
	return sha
}

// duoScript is a flow job's script as GitLab generates it, with a stand-in for `duo run` (the
// duo CLI cannot be installed here): it changes the code, runs the project's tests, commits and
// pushes a branch over HTTP with the workflow's credentials, and leaves a session summary as
// an artifact. It also tries to leave the instance network, which must fail.
var duoScript = []string{
	"mkdir -p /opt/.gitlab-sandbox",
	// setup_script from agent-config.yml
	`echo "setup: node $(node --version), npm $(npm --version), $(git --version)"`,
	`echo "helper: $(command -v gitlab-runner)"`,
	`if [ -d node_modules/tiny-greet ]; then echo "before npm install: node_modules/tiny-greet present"; else echo "before npm install: node_modules absent"; fi`,
	"npm install",
	`git remote set-url origin "http://${DUO_WORKFLOW_GIT_HTTP_USER}:${DUO_WORKFLOW_GIT_HTTP_PASSWORD}@${DUO_WORKFLOW_GIT_HTTP_BASE_URL#http://}/${CI_PROJECT_PATH}.git"`,
	`command -v duo || echo "duo CLI not in the image: running the stand-in agent step"`,
	// the stand-in agent step
	`git checkout -q -b "duo/workflow-${CI_JOB_ID}"`,
	`sed -i "s|^}$|  farewell: name => 'Goodbye, ' + name + '!',\n}|" index.js`,
	`echo "assert.strictEqual(app.farewell('Duo'), 'Goodbye, Duo!')" >> test.js`,
	"npm test",
	`git add index.js test.js`,
	`git -c user.name="Duo Agent" -c user.email=duo@example.com commit -q -m "Duo: ${DUO_WORKFLOW_GOAL}"`,
	"git push -q origin HEAD",
	`mkdir -p duo-session && git log -1 --format="pushed %H on duo/workflow-${CI_JOB_ID}" > duo-session/summary.txt && cat duo-session/summary.txt`,
	// egress: the instance answers (positive control), the outside world must not
	`curl -fsS -o /dev/null "${CI_SERVER_URL}/npm/tiny-greet" && echo "egress to the instance: allowed"`,
	`if curl -sS --connect-timeout 3 --max-time 5 -o /dev/null ` + localcluster.OutsideURL + `; then echo "egress outside: REACHED"; else echo "egress outside: blocked"; fi`,
}

func (inst *instance) duoJob(sha string) fakegitlab.Job {
	secret := func(k, v string) fakegitlab.Variable { return fakegitlab.Variable{Key: k, Value: v, Masked: true} }
	plain := func(k, v string) fakegitlab.Variable { return fakegitlab.Variable{Key: k, Value: v, Public: true} }
	return inst.gitlab.NewJob(fakegitlab.JobSpec{
		Name:        "duo-workflow",
		ProjectPath: duoProject,
		SHA:         sha,
		Image:       ciImage,
		GitStrategy: "clone",
		Tags:        []string{"gitlab--duo"},
		Script:      duoScript,
		Cache:       []fakegitlab.Cache{{Key: duoCacheKey, Paths: []string{"node_modules/"}, Policy: "pull-push"}},
		Artifacts: []fakegitlab.Artifact{{Name: "duo-session", Paths: []string{"duo-session/"}, When: "on_success",
			Type: "archive", Format: "zip", ExpireIn: "1 week"}},
		Variables: []fakegitlab.Variable{
			plain("GIT_DEPTH", "1"),
			plain("GIT_LFS_SKIP_SMUDGE", "1"),
			plain("DUO_WORKFLOW_GOAL", "Add a farewell to the app"),
			plain("DUO_WORKFLOW_DEFINITION", "software_development"),
			plain("DUO_WORKFLOW_PROJECT_ID", "1"),
			plain("DUO_WORKFLOW_NAMESPACE_ID", "1"),
			plain("DUO_WORKFLOW_GIT_HTTP_BASE_URL", inst.gitlab.URL()),
			plain("DUO_WORKFLOW_GIT_HTTP_USER", duoGitUser),
			secret("DUO_WORKFLOW_GIT_HTTP_PASSWORD", inst.gitPassword),
			plain("DUO_WORKFLOW_SERVICE_SERVER", inst.host+":443"),
			secret("DUO_WORKFLOW_SERVICE_TOKEN", "duo-e2e-service-token-0123456789"),
			plain("GITLAB_BASE_URL", inst.gitlab.URL()),
			secret("GITLAB_TOKEN", "glpat-duo-e2e-0123456789"),
			secret("GITLAB_OAUTH_TOKEN", "duo-e2e-oauth-0123456789"),
		},
	})
}

// runJob runs job through a fresh gitlab-runner 12.8 process with the S3 cache.
func (inst *instance) runJob(t *testing.T, c *cluster, job fakegitlab.Job) fakegitlab.Result {
	t.Helper()
	inst.gitlab.Enqueue(job)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	proc, err := runner.Start(runner.Options{
		URL: inst.gitlab.URL(), Token: inst.gitlab.RunnerToken(), Executor: c.customExecutor(), Timeout: 5 * time.Minute,
		Cache: &runner.S3Cache{ServerAddress: inst.host, AccessKey: cacheAccessKey, SecretKey: inst.cache.SecretKey, BucketName: cacheBucket, Insecure: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer proc.Stop()
	res, err := inst.gitlab.Wait(ctx, job.ID)
	if err != nil {
		t.Fatalf("%v; runner log:\n%s", err, proc.Log())
	}
	if res.State != fakegitlab.StateSuccess {
		t.Fatalf("job %d: %s (%s); trace:\n%s\nrunner log:\n%s", job.ID, res.State, res.FailureReason, res.Trace, proc.Log())
	}
	return res
}

var (
	helperCopied = regexp.MustCompile(`Copied the runner helper \(([^)]*)\) into the pod as \S+ in (\d+ ms)`)
	sandboxReady = regexp.MustCompile(`Sandbox ready: [^\x1b\n]*`)
)

// TestDuoFlowJob runs a Duo-shaped flow job twice through the real gitlab-runner 12.8 and
// sandbox-executor, against an instance on the network job pods may reach: the job clones the
// project (GIT_DEPTH=1), installs its dependency from the instance's registry, runs its tests,
// pushes its change back over HTTP, caches node_modules/ in S3 and uploads an artifact, with
// the runner's helper copied into the pod (helper_binary), not baked into the image.
func TestDuoFlowJob(t *testing.T) {
	c := newCluster(t)
	helper, err := runner.BinaryPath()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WriteConfig(c.configPath, c.runnerName, fmt.Sprintf("helper_binary = %q", helper)); err != nil {
		t.Fatal(err)
	}
	// The outside world is up (from here): a pod that cannot reach it is stopped by its policy.
	if resp, err := http.Get(localcluster.OutsideURL); err != nil {
		t.Fatalf("positive control: %s is not answering from this machine: %v", localcluster.OutsideURL, err)
	} else {
		resp.Body.Close()
	}
	inst := newInstance(t)
	base := inst.createProject(t)

	first := inst.duoJob(base)
	res1 := inst.runJob(t, c, first)
	mustContain(t, "job 1 trace", res1.Trace,
		"Sandbox ready: pool duo-default", "helper: /tmp/.sandbox-executor/bin/gitlab-runner",
		"Fetching changes with git depth set to 1", "before npm install: node_modules absent",
		"tests passed: welcome, farewell", "Creating cache "+duoCacheKey, "Created cache",
		"Uploading artifacts", "egress to the instance: allowed", "egress outside: blocked")
	cacheKeys := inst.cache.Keys()
	if len(cacheKeys) != 1 || !strings.HasSuffix(cacheKeys[0], "/"+duoCacheKey) {
		t.Fatalf("S3 cache objects after job 1: %q, want one for %s", cacheKeys, duoCacheKey)
	}
	if n := inst.npm.Downloads(duoDependency); n != 1 {
		t.Errorf("job 1 downloaded %s %d times, want 1", duoDependency, n)
	}

	second := inst.duoJob(base)
	res2 := inst.runJob(t, c, second)
	mustContain(t, "job 2 trace", res2.Trace,
		"Checking cache for "+duoCacheKey, "Successfully extracted cache",
		"before npm install: node_modules/tiny-greet present", "tests passed: welcome, farewell", "egress outside: blocked")
	if n := inst.npm.Downloads(duoDependency); n != 1 {
		t.Errorf("%s downloaded %d times in all, want 1: job 2 should have used the restored node_modules", duoDependency, n)
	}
	var cacheGets int
	for _, r := range inst.cache.Requests() {
		if r.Method == http.MethodGet && r.Status == http.StatusOK {
			cacheGets++
		}
	}
	if cacheGets != 1 {
		t.Errorf("S3 cache served %d downloads, want 1 (job 2's restore): %+v", cacheGets, inst.cache.Requests())
	}

	for _, tc := range []struct {
		job fakegitlab.Job
		res fakegitlab.Result
	}{{first, res1}, {second, res2}} {
		branch := fmt.Sprintf("duo/workflow-%d", tc.job.ID)
		pushed := inst.assertPushed(t, branch, base)
		assertArtifact(t, tc.res, "pushed "+pushed+" on "+branch)
		for _, v := range tc.job.Variables {
			if v.Masked && strings.Contains(tc.res.Trace, v.Value) {
				t.Errorf("job %d: the value of %s appears in the trace", tc.job.ID, v.Key)
			}
		}
		c.assertJobGone(t, tc.job.ID)
		copied := helperCopied.FindStringSubmatch(tc.res.Trace)
		if copied == nil {
			t.Errorf("job %d: no helper copy line in the trace", tc.job.ID)
			continue
		}
		t.Logf("job %d: %s in %s (handed out -> final state); helper (%s) copied in %s; %s",
			tc.job.ID, tc.res.State, tc.res.Duration().Round(time.Millisecond), copied[1], copied[2], sandboxReady.FindString(tc.res.Trace))
	}
}

// assertPushed checks that branch arrived in the bare repository: one commit on top of base,
// by the agent, with the change and nothing else. It returns the pushed commit.
func (inst *instance) assertPushed(t *testing.T, branch, base string) string {
	t.Helper()
	parent, err := inst.repos.RepoGit(duoProject, "rev-parse", branch+"~1")
	if err != nil || parent != base {
		t.Errorf("branch %s: parent %q (%v), want the job's commit %s", branch, parent, err, base)
		return ""
	}
	author, _ := inst.repos.RepoGit(duoProject, "log", "-1", "--format=%an: %s", branch)
	files, _ := inst.repos.RepoGit(duoProject, "diff", "--name-only", base, branch)
	code, _ := inst.repos.RepoGit(duoProject, "show", branch+":index.js")
	if author != "Duo Agent: Duo: Add a farewell to the app" || files != "index.js\ntest.js" || !strings.Contains(code, "farewell: name => 'Goodbye, ' + name + '!'") {
		t.Errorf("branch %s: commit %q changing %q; index.js:\n%s", branch, author, files, code)
	}
	head, _ := inst.repos.RepoGit(duoProject, "rev-parse", branch)
	return head
}

// assertArtifact checks the job's artifacts archive: the session summary saying what it pushed.
func assertArtifact(t *testing.T, res fakegitlab.Result, want string) {
	t.Helper()
	if len(res.Artifacts) != 1 {
		t.Errorf("job %d uploaded %d artifacts, want 1", res.JobID, len(res.Artifacts))
		return
	}
	archive, err := zip.NewReader(bytes.NewReader(res.Artifacts[0].Data), int64(len(res.Artifacts[0].Data)))
	if err != nil {
		t.Errorf("job %d: artifact is not a zip: %v", res.JobID, err)
		return
	}
	for _, f := range archive.File {
		if f.Name != "duo-session/summary.txt" {
			continue
		}
		r, _ := f.Open()
		summary, _ := io.ReadAll(r)
		r.Close()
		if got := strings.TrimSpace(string(summary)); got != want {
			t.Errorf("job %d: artifact summary %q, want %q", res.JobID, got, want)
		}
		return
	}
	t.Errorf("job %d: no duo-session/summary.txt in the artifact", res.JobID)
}
