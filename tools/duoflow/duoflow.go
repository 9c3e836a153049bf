// Package duoflow stages a GitLab Duo Agent Platform flow job the way a job pod meets it: a
// GitLab instance on the network job pods may reach (tests/harness/localcluster), serving the API, the
// project's repository over smart HTTP, the runner's S3 cache and an npm registry on one
// address, and the flow job's script with a stand-in for `duo run` (the duo CLI cannot be
// installed here). The e2e suite and the demo share it.
package duoflow

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakedws"
	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakenpm"
	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakes3"
	"github.com/sandbox-executor/sandbox-executor/tests/fakes/gitserver"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
	"github.com/sandbox-executor/sandbox-executor/tests/runner"
)

// What the flow works on.
const (
	Project    = "duo/todo-app"
	GitUser    = "duo-workflow"
	Goal       = "Add a farewell to the app"
	CacheKey   = "duo-node-modules"
	Dependency = "tiny-greet"

	cacheBucket    = "runner-cache"
	cacheAccessKey = "AKIDDUOFLOWCACHE"
)

// Instance is the GitLab instance of a flow, as far as a job sees it.
type Instance struct {
	GitLab *fakegitlab.Server
	Repos  *gitserver.Server
	Cache  *fakes3.Server
	NPM    *fakenpm.Registry
	// Workflows is the Duo Workflow Service's WebSocket on the instance (the stock flow's).
	Workflows *fakedws.Service
	// Host is the instance's address (port 80, or 443 over HTTPS), reachable from job pods and
	// from this machine.
	Host string

	gitPassword string
	reposDir    string
}

// NewInstance starts the instance on an address of its own on the instance network. Close it.
func NewInstance() (*Instance, error) {
	listener, err := localcluster.ListenOnInstanceNetwork()
	if err != nil {
		return nil, err
	}
	return newInstance(listener)
}

// NewHTTPSInstance starts the instance over HTTPS on port 443 of an address of its own, with a
// certificate of ca for that address and for names (the names runners reach it by). Close it.
func NewHTTPSInstance(ca *fakegitlab.CA, names ...string) (*Instance, error) {
	listener, err := localcluster.ListenOnInstanceNetworkPort("443")
	if err != nil {
		return nil, err
	}
	ip, _, _ := net.SplitHostPort(listener.Addr().String())
	cert, err := ca.ServerCert(append([]string{ip}, names...)...)
	if err != nil {
		listener.Close()
		return nil, err
	}
	return newInstance(listener, fakegitlab.WithTLS(cert))
}

func newInstance(listener net.Listener, options ...fakegitlab.Option) (*Instance, error) {
	reposDir, err := os.MkdirTemp("", "duoflow-repos")
	if err != nil {
		listener.Close()
		return nil, err
	}
	inst := &Instance{
		GitLab:      fakegitlab.New(append([]fakegitlab.Option{fakegitlab.WithLongPolling(2 * time.Second), fakegitlab.WithListener(listener)}, options...)...),
		Cache:       fakes3.New(cacheBucket, cacheAccessKey, secret("cache-secret")),
		Workflows:   fakedws.New(),
		gitPassword: secret("git-password"),
		reposDir:    reposDir,
	}
	inst.Host = strings.TrimPrefix(strings.TrimPrefix(inst.GitLab.URL(), "http://"), "https://")
	// Like GitLab: a running job's token clones its project; only the flow's own credentials push.
	inst.Repos, err = gitserver.New(reposDir, func(user, password, repo string, access gitserver.Access) bool {
		switch {
		case repo != Project:
			return false
		case user == "gitlab-ci-token":
			return access == gitserver.Fetch && inst.GitLab.ValidJobToken(password)
		default:
			return user == GitUser && password == inst.gitPassword
		}
	})
	if err == nil {
		inst.NPM, err = fakenpm.New("/npm/", fakenpm.Package{Name: Dependency, Version: "1.4.0", Files: map[string]string{
			"index.js": "module.exports = name => 'Hello, ' + name + '!'\n",
		}})
	}
	if err != nil {
		inst.Close()
		return nil, err
	}
	inst.GitLab.Handle("/"+Project+".git/", inst.Repos)
	inst.GitLab.Handle("/"+cacheBucket+"/", inst.Cache)
	inst.GitLab.Handle("/npm/", inst.NPM)
	inst.GitLab.Handle(fakedws.Path, inst.Workflows)
	return inst, nil
}

// Close stops the instance and releases its address.
func (inst *Instance) Close() {
	inst.GitLab.Close()
	os.RemoveAll(inst.reposDir)
}

func secret(what string) string {
	random := make([]byte, 12)
	_, _ = rand.Read(random)
	return "duoflow-" + what + "-" + hex.EncodeToString(random)
}

// CreateProject pushes the project the flow works on, a small Node.js app with a dependency
// and tests whose .npmrc points npm at the instance's registry, and returns its commit.
func (inst *Instance) CreateProject() (string, error) {
	return inst.Repos.CreateRepo(Project, "main", map[string]string{
		"README.md": "# todo-app\n\nA small app the Duo flow works on.\n",
		".npmrc":    "registry=" + inst.GitLab.URL() + "/npm/\naudit=false\nfund=false\nupdate-notifier=false\n",
		"package.json": `{
  "name": "todo-app",
  "version": "1.0.0",
  "private": true,
  "scripts": {"test": "node test.js"},
  "dependencies": {"` + Dependency + `": "^1.0.0"}
}
`,
		"index.js": "const greet = require('" + Dependency + "')\n\nmodule.exports = {\n  welcome: name => greet(name),\n}\n",
		"test.js":  "const assert = require('assert')\nconst app = require('./index')\n\nassert.strictEqual(app.welcome('Duo'), 'Hello, Duo!')\nconsole.log('tests passed:', Object.keys(app).join(', '))\n",
	})
}

// Script is a flow job's script as GitLab generates it, with a stand-in agent step: it changes
// the code, runs the project's tests, commits and pushes a branch over HTTP with the flow's
// credentials, and leaves a session summary as an artifact. It also tries to leave the instance
// network, which the pod's NetworkPolicy must stop.
var Script = []string{
	"mkdir -p /opt/.gitlab-sandbox",
	// setup_script from agent-config.yml
	`echo "setup: node $(node --version), npm $(npm --version), $(git --version)"`,
	`echo "helper: $(command -v gitlab-runner)"`,
	`if [ -d node_modules/` + Dependency + ` ]; then echo "before npm install: node_modules/` + Dependency + ` present"; else echo "before npm install: node_modules absent"; fi`,
	"npm install",
	`git remote set-url origin "http://${DUO_WORKFLOW_GIT_HTTP_USER}:${DUO_WORKFLOW_GIT_HTTP_PASSWORD}@${DUO_WORKFLOW_GIT_HTTP_BASE_URL#http://}/${CI_PROJECT_PATH}.git"`,
	`command -v duo || echo "duo CLI not in the image: running the stand-in agent step"`,
	// the stand-in agent step
	Change[0], Change[1], Change[2],
	"npm test",
	Commit[0], Commit[1],
	"git push -q origin HEAD",
	`mkdir -p duo-session && git log -1 --format="pushed %H on duo/workflow-${CI_JOB_ID}" > duo-session/summary.txt && cat duo-session/summary.txt`,
	// egress: the instance answers (positive control), the outside world must not
	`curl -fsS -o /dev/null "${CI_SERVER_URL}/npm/` + Dependency + `" && echo "egress to the instance: allowed"`,
	`if curl -sS --connect-timeout 3 --max-time 5 -o /dev/null ` + localcluster.OutsideURL + `; then echo "egress outside: REACHED"; else echo "egress outside: blocked"; fi`,
}

// Change is the stand-in agent's change to the project, on the job's branch (Branch): a
// farewell and its test. Commit commits it as the agent.
var (
	Change = []string{
		`git checkout -q -b "duo/workflow-${CI_JOB_ID}"`,
		`sed -i "s|^}$|  farewell: name => 'Goodbye, ' + name + '!',\n}|" index.js`,
		`echo "assert.strictEqual(app.farewell('Duo'), 'Goodbye, Duo!')" >> test.js`,
	}
	Commit = []string{
		`git add index.js test.js`,
		`git -c user.name="Duo Agent" -c user.email=duo@example.com commit -q -m "Duo: ${DUO_WORKFLOW_GOAL}"`,
	}
)

// Branch is where job jobID pushes its change.
func Branch(jobID int64) string { return fmt.Sprintf("duo/workflow-%d", jobID) }

// Job is the flow job GitLab hands out for commit sha of the project, in image: Duo's
// variables (tokens masked), a clone with GIT_DEPTH=1, node_modules/ cached under CacheKey and
// the session summary as an artifact.
func (inst *Instance) Job(sha, image string) fakegitlab.Job {
	masked := func(k, v string) fakegitlab.Variable { return fakegitlab.Variable{Key: k, Value: v, Masked: true} }
	plain := func(k, v string) fakegitlab.Variable { return fakegitlab.Variable{Key: k, Value: v, Public: true} }
	return inst.GitLab.NewJob(fakegitlab.JobSpec{
		Name:        "duo-workflow",
		ProjectPath: Project,
		SHA:         sha,
		Image:       image,
		GitStrategy: "clone",
		Tags:        []string{"gitlab--duo"},
		Script:      Script,
		Cache:       []fakegitlab.Cache{{Key: CacheKey, Paths: []string{"node_modules/"}, Policy: "pull-push"}},
		Artifacts: []fakegitlab.Artifact{{Name: "duo-session", Paths: []string{"duo-session/"}, When: fakegitlab.WhenOnSuccess,
			Type: "archive", Format: "zip", ExpireIn: "1 week"}},
		Variables: []fakegitlab.Variable{
			plain("GIT_DEPTH", "1"),
			plain("GIT_LFS_SKIP_SMUDGE", "1"),
			plain("DUO_WORKFLOW_GOAL", Goal),
			plain("DUO_WORKFLOW_DEFINITION", "software_development"),
			plain("DUO_WORKFLOW_PROJECT_ID", "1"),
			plain("DUO_WORKFLOW_NAMESPACE_ID", "1"),
			plain("DUO_WORKFLOW_GIT_HTTP_BASE_URL", inst.GitLab.URL()),
			plain("DUO_WORKFLOW_GIT_HTTP_USER", GitUser),
			masked("DUO_WORKFLOW_GIT_HTTP_PASSWORD", inst.gitPassword),
			plain("DUO_WORKFLOW_SERVICE_SERVER", inst.Host+":443"),
			masked("DUO_WORKFLOW_SERVICE_TOKEN", secret("service-token")),
			plain("GITLAB_BASE_URL", inst.GitLab.URL()),
			masked("GITLAB_TOKEN", secret("gitlab-token")),
			masked("GITLAB_OAUTH_TOKEN", secret("oauth-token")),
		},
	})
}

// RunnerCache is the runner's [runners.cache] for the instance's S3 stand-in.
func (inst *Instance) RunnerCache() *runner.S3Cache {
	return &runner.S3Cache{ServerAddress: inst.Host, AccessKey: cacheAccessKey, SecretKey: inst.Cache.SecretKey, BucketName: cacheBucket, Insecure: true}
}

// HelperConfig is the executor config line that copies the runner's helper binary
// (gitlab-runner-helper, runner.HelperPath) into job pods, where the cache and artifacts stages
// call it as gitlab-runner.
func HelperConfig() (string, error) {
	helper, err := runner.HelperPath()
	if err != nil {
		return "", err
	}
	return HelperConfigFor(helper), nil
}

// HelperConfigFor is the executor config line that makes helper the runner's helper binary.
func HelperConfigFor(helper string) string {
	return fmt.Sprintf("helper_binary = %q", helper)
}
