package duoflow

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/sandbox-executor/sandbox-executor/tests/duocli"
	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakedws"
	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakenpm"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
)

// The stock flow: a job GitLab makes for a flow with no image: in agent-config.yml, so it runs
// in GitLab's default image; the duo CLI it installs from the npm registry (a stand-in on an
// address of its own, reached only if the pool allows it) holds a WebSocket session with the
// workflow service through the instance and does the agent's work as the service directs, up
// to a merge request opened with the job's token.

// NPMRegistry is the npm registry stand-in of the stock flow, serving @gitlab/duo-cli.
type NPMRegistry struct {
	*fakenpm.Registry
	// URL is the registry's base URL; Host its address (port 80).
	URL, Host string
	server    *http.Server
}

// NewNPMRegistry starts the npm registry on an address of its own on the instance network: not
// the instance's, so that a job reaches it only through a grant of its own. Close it.
func NewNPMRegistry() (*NPMRegistry, error) {
	listener, err := localcluster.ListenOnInstanceNetwork()
	if err != nil {
		return nil, err
	}
	registry, err := fakenpm.New("/", duocli.Package())
	if err != nil {
		listener.Close()
		return nil, err
	}
	host := strings.TrimSuffix(listener.Addr().String(), ":80")
	r := &NPMRegistry{Registry: registry, URL: "http://" + host + "/", Host: host, server: &http.Server{Handler: registry}}
	go func() { _ = r.server.Serve(listener) }()
	return r, nil
}

// Close stops the registry and releases its address.
func (r *NPMRegistry) Close() { _ = r.server.Close() }

// NPMRegistryVariable names the npm registry stand-in in the stock job; its setup_script makes it
// the global npm registry (npm config set --location=global), which `npm install -g` uses while the project's
// own .npmrc keeps serving the project's install.
const NPMRegistryVariable = "DUO_TEST_NPM_REGISTRY"

// SRTSettings is where the flow's script writes SRT's settings (GitLab's SANDBOX_SYSTEM_DIR).
const SRTSettings = "/var/tmp/.gitlab-sandbox/srt-settings.json"

// NetworkPolicy is agent-config.yml's network_policy as a project writes it. GitLab never sends
// it to the runner: it writes it into SRT's settings inside the job script (SRTSettings).
type NetworkPolicy struct {
	AllowedDomains            []string
	DeniedDomains             []string
	IncludeRecommendedAllowed bool
	AllowAllUnixSockets       bool
}

// RecommendedDomains are some of the domains GitLab adds to SRT's allowlist for
// include_recommended_allowed (its Gitlab::DuoWorkflow::NetworkPolicyDomains lists about 200:
// code hosts, container and package registries, clouds); PyPI and RubyGems are the first of
// its Python and Ruby lists.
var RecommendedDomains = []string{"github.com", "registry.gitlab.com", "pypi.org", "files.pythonhosted.org", "rubygems.org", "crates.io", "repo1.maven.org"}

// ProjectAllowedDomain is what the project's agent-config.yml network_policy.allowed_domains
// lists: GitLab writes it into SRT's settings, which nothing enforces here (SRT falls back), and
// the egress proxy still refuses it: a project cannot widen its egress.
const ProjectAllowedDomain = "outside.sandbox.test"

// ProjectDeniedDomain is a domain the project's network_policy.denied_domains lists that nothing
// grants the job: the egress proxy refuses it.
const ProjectDeniedDomain = "denied.sandbox.test"

// StockNetworkPolicy is the network_policy of the stock flow's project: it allows
// ProjectAllowedDomain and GitLab's recommended domains, denies ProjectDeniedDomain and the
// npm registry the flow's pool grants (npmHost), and allows all Unix sockets.
func StockNetworkPolicy(npmHost string) NetworkPolicy {
	return NetworkPolicy{
		AllowedDomains:            []string{ProjectAllowedDomain},
		DeniedDomains:             []string{npmHost, ProjectDeniedDomain},
		IncludeRecommendedAllowed: true,
		AllowAllUnixSockets:       true,
	}
}

// SRTSettings is SRT's settings file as GitLab writes it for a job of instanceHost under
// policy p: its own allowlist (the instance, its subdomains, localhost, host.docker.internal),
// the project's allowed domains and, with include_recommended_allowed, the recommended ones;
// the denied domains; and the filesystem rules around the agent.
func (p NetworkPolicy) SRTSettings(instanceHost string) string {
	allowed := append([]string{"host.docker.internal", "localhost", instanceHost, "*." + instanceHost}, p.AllowedDomains...)
	if p.IncludeRecommendedAllowed {
		allowed = append(allowed, RecommendedDomains...)
	}
	settings := map[string]any{
		"network": map[string]any{
			"allowedDomains":      allowed,
			"deniedDomains":       append([]string{}, p.DeniedDomains...),
			"allowAllUnixSockets": p.AllowAllUnixSockets,
		},
		"filesystem": map[string]any{
			"denyRead":   []string{"~/.ssh"},
			"allowWrite": []string{"./", "/tmp"},
			"denyWrite":  []string{"/var/tmp/.gitlab-sandbox"},
		},
	}
	data, _ := json.Marshal(settings) // maps of strings, slices and bools always encode
	return string(data)
}

// shellQuote quotes s as one word for a POSIX shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// InstallCLIUnlessPresent is GitLab's line that installs the duo CLI from npm unless the image
// has it (GitLab's flow images from v0.0.11 do).
const InstallCLIUnlessPresent = `command -v duo > /dev/null 2>&1 && echo "duo-cli already present, skipping installation" || npm install -g --no-audit --no-fund @gitlab/duo-cli@` + duocli.Version

// StockScript is the stock flow job's script in the order GitLab generates it (its
// StartWorkflowService and DuoWorkflow::Sandbox, rewritten here): the sandbox directory, the
// setup_script, the oauth remote, the duo CLI unless the image has it, then, when the image has
// SRT, SRT's settings (srtSettings, agent-config.yml's network_policy among them) and `duo run`
// wrapped in SRT when SRT can build its sandbox, else run directly with GitLab's warning. Then
// one attempt to reach a destination nothing allows, which the egress proxy must refuse and the
// job log name.
func StockScript(srtSettings string, setupScript ...string) []string {
	script := []string{"mkdir -p /var/tmp/.gitlab-sandbox"}
	script = append(script, setupScript...)
	return append(script,
		`git remote set-url origin "http://${DUO_WORKFLOW_GIT_HTTP_USER}:${DUO_WORKFLOW_GIT_HTTP_PASSWORD}@${DUO_WORKFLOW_GIT_HTTP_BASE_URL#http://}/${CI_PROJECT_PATH}.git"`,
		InstallCLIUnlessPresent,
		`which duo && duo --version`,
		`if which srt > /dev/null; then
  echo "SRT found, creating config..."
  echo `+shellQuote(srtSettings)+` > `+SRTSettings+`
  if unshare -m true 2>/dev/null; then SANDBOX_UNSHARE="unshare -m"; elif unshare -rm true 2>/dev/null; then SANDBOX_UNSHARE="unshare -rm"; else SANDBOX_UNSHARE=""; fi
  echo "srt probe: unshare=[${SANDBOX_UNSHARE}]"
  if $SANDBOX_UNSHARE srt --settings `+SRTSettings+` true 2>/tmp/srt-probe.err; then
    echo "SRT sandbox test successful"
    $SANDBOX_UNSHARE srt --settings `+SRTSettings+` duo run --existing-session-id "$CI_JOB_ID" --connection-type websocket
  else
    echo "srt probe failed: $(head -c 300 /tmp/srt-probe.err | tr '\n' ' ')"
    echo "Warning: SRT found but can't create sandbox (insufficient privileges), running command directly"
    duo run --existing-session-id "$CI_JOB_ID" --connection-type websocket
  fi
else
  echo "Warning: srt is not installed or not in PATH, running command directly without sandbox"
  duo run --existing-session-id "$CI_JOB_ID" --connection-type websocket
fi`,
		// The job tries to widen its own egress through the proxy's admin endpoint: the proxy
		// does not forward to it (and the pod's NetworkPolicy would drop a direct connection).
		`if curl -sS --max-time 10 -o /dev/null -X PUT -d '{"allow":["`+ProjectAllowedDomain+`"],"until":"2100-01-01T00:00:00Z"}' -w "self-grant: HTTP %{http_code}\n" "${`+EgressAdminVariable+`}/v1/grants?client=$(hostname -i)"; then :; fi`,
		`if curl -sS --max-time 10 -o /dev/null -w "outside: HTTP %{http_code}\n" http://outside.sandbox.test/; then :; fi`,
	)
}

// EgressAdminVariable names the egress proxy's admin address in the stock job, which the job
// tries, and must fail, to grant itself more egress through.
const EgressAdminVariable = "DUO_TEST_EGRESS_ADMIN"

// StockActions are what the workflow service has the agent do for job jobID: branch, install
// the project's dependency from the instance's registry, change the code, test, commit and
// push, and open a merge request.
func StockActions(jobID int64) []fakedws.Action {
	branch := Branch(jobID)
	return []fakedws.Action{
		{"action": "run_command", "command": "git checkout -q -b " + branch + " && echo on " + branch},
		{"action": "run_command", "command": "npm install --no-audit --no-fund"},
		{"action": "edit_file", "path": "index.js", "old": "  welcome: name => greet(name),\n", "new": "  welcome: name => greet(name),\n  farewell: name => 'Goodbye, ' + name + '!',\n"},
		{"action": "edit_file", "path": "test.js", "old": "console.log(", "new": "assert.strictEqual(app.farewell('Duo'), 'Goodbye, Duo!')\nconsole.log("},
		{"action": "run_command", "command": "npm test"},
		{"action": "run_command", "command": `git add index.js test.js && git -c user.name="Duo Agent" -c user.email=duo@example.com commit -q -m "Duo: ${DUO_WORKFLOW_GOAL}" && git push -q origin HEAD && git log -1 --format="pushed %H"`},
		{"action": "create_merge_request", "source_branch": branch, "target_branch": "main", "title": "Duo: " + Goal},
	}
}

// StockJob is the stock flow's job for commit sha, with no image (the runner's default pool
// serves it), its duo CLI from npmRegistry and egressAdmin the proxy's admin address; the instance's workflow service expects its
// session (workflow ID: the job ID).
func (inst *Instance) StockJob(sha, npmRegistry, egressAdmin string, setupScript ...string) fakegitlab.Job {
	job := inst.Job(sha, "")
	job.Steps[0].Script = StockScript(StockNetworkPolicy(hostOf(npmRegistry)).SRTSettings(inst.Host), setupScript...)
	job.Artifacts = nil // the flow's work is its branch and merge request
	job.Variables = append(job.Variables,
		fakegitlab.Variable{Key: NPMRegistryVariable, Value: npmRegistry, Public: true},
		fakegitlab.Variable{Key: EgressAdminVariable, Value: egressAdmin, Public: true},
		fakegitlab.Variable{Key: "NPM_CONFIG_UPDATE_NOTIFIER", Value: "false", Public: true})
	token, _ := job.Variable("GITLAB_OAUTH_TOKEN")
	inst.Workflows.Expect(strconv.FormatInt(job.ID, 10), token, StockActions(job.ID)...)
	return job
}

// hostOf is the host of url, or url itself when it has none.
func hostOf(rawURL string) string {
	if u, err := url.Parse(rawURL); err == nil && u.Hostname() != "" {
		return u.Hostname()
	}
	return rawURL
}

// FilesCacheKey is the cache key GitLab sends the runner for agent-config.yml's
// `cache: {key: {files: [...], prefix: P}}`: GitLab computes it on its side, P, a dash and a
// checksum over the last commits that changed the files (up to two), so the runner and the
// executor see a plain string. This computes it the same way from the project's repository.
func (inst *Instance) FilesCacheKey(prefix, ref string, files ...string) (string, error) {
	if len(files) > 2 {
		files = files[:2]
	}
	var commits []string
	for _, f := range files {
		c, err := inst.Repos.RepoGit(Project, "log", "-1", "--format=%H", ref, "--", f)
		if err != nil {
			return "", err
		}
		commits = append(commits, c)
	}
	sum := sha256.Sum256([]byte(strings.Join(commits, "\n")))
	return prefix + "-" + hex.EncodeToString(sum[:])[:40], nil
}

// StockMergeRequestTitle is the title of the merge request the stock flow opens.
var StockMergeRequestTitle = fmt.Sprintf("Duo: %s", Goal)
