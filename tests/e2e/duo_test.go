//go:build e2e

package e2e

import (
	"archive/zip"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
	"github.com/sandbox-executor/sandbox-executor/tests/runner"
	"github.com/sandbox-executor/sandbox-executor/tools/duoflow"
)

// runDuoJob runs job through a fresh gitlab-runner process (17.9.0 unless
// SANDBOX_EXECUTOR_GITLAB_RUNNER says otherwise) with the instance's S3 cache.
func runDuoJob(t *testing.T, c *clusterjobs.Runner, inst *duoflow.Instance, job fakegitlab.Job) fakegitlab.Result {
	t.Helper()
	return runDuoJobWith(t, c.Definition(), inst, job, nil)
}

// runDuoJobWith runs job as runDuoJob does, with def as the runner's executor. atCleanup, if
// set, runs once the runner has started and before the job's final state is awaited: with an
// executor that holds cleanup_exec, it looks into the job's pod after the job's last stage.
func runDuoJobWith(t *testing.T, def runner.CustomExecutor, inst *duoflow.Instance, job fakegitlab.Job, atCleanup func(*runner.Process)) fakegitlab.Result {
	t.Helper()
	res, runnerLog := runJobToItsEnd(t, def, inst, job, atCleanup)
	if res.State != fakegitlab.StateSuccess {
		t.Fatalf("job %d: %s (%s); trace:\n%s\nrunner log:\n%s", job.ID, res.State, res.FailureReason, res.Trace, runnerLog)
	}
	return res
}

// runJobToItsEnd runs job through the real gitlab-runner with def as its executor until GitLab
// has the job's final state, whatever it is, and the runner has ended its own work; it returns
// that state and the runner's log.
func runJobToItsEnd(t *testing.T, def runner.CustomExecutor, inst *duoflow.Instance, job fakegitlab.Job, atCleanup func(*runner.Process)) (fakegitlab.Result, string) {
	t.Helper()
	inst.GitLab.Enqueue(job)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	proc, err := runner.Start(runner.Options{
		URL: inst.GitLab.URL(), Token: inst.GitLab.RunnerToken(), Executor: def, Timeout: 5 * time.Minute,
		Cache: inst.RunnerCache(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer proc.Stop()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("job %d: runner log:\n%s", job.ID, proc.Log())
		}
	})
	if atCleanup != nil {
		atCleanup(proc)
	}
	res, err := inst.GitLab.Wait(ctx, job.ID)
	if err != nil {
		t.Fatalf("%v; runner log:\n%s", err, proc.Log())
	}
	// The runner has sent the final state; it exits once it has also ended its own work.
	if _, err := proc.Wait(ctx); err != nil {
		t.Errorf("job %d: %v", job.ID, err)
	}
	return res, proc.Log()
}

var (
	helperCopied = regexp.MustCompile(`Copied the runner helper \(([^)]*)\) into the pod as \S+ in (\d+ ms)`)
	// A pod whose agent image carries the runner's own helper gets it linked instead.
	helperBaked  = regexp.MustCompile(`Runner helper: baked in the pod \(sha256 ([0-9a-f]{12})…\), checked and linked as \S+ in (\d+ ms)`)
	sandboxReady = regexp.MustCompile(`Sandbox ready: [^\x1b\n]*`)
)

// TestDuoFlowJob runs a Duo-shaped flow job twice through the real gitlab-runner and
// sandbox-executor, against an instance on the network job pods may reach: the job clones the
// project (GIT_DEPTH=1), installs its dependency from the instance's registry, runs its tests,
// pushes its change back over HTTP, caches node_modules/ in S3 and uploads an artifact, with
// the runner's helper copied into the pod (helper_binary): the cache and artifacts round trips
// go through the copy. The local pools' agent image carries the runner's own helper
// (tests/cluster/images.sh), which prepare would link instead (TestStockDuoFlowHardenedImage
// proves that path), so helper_binary here is another build of it (anotherBuildOf: the same
// binary with bytes appended, as after a runner upgrade without the agent image's): prepare
// says the baked one is not this runner's and copies it.
func TestDuoFlowJob(t *testing.T) {
	t.Parallel()
	realHelper, err := runner.HelperPath()
	if err != nil {
		t.Fatal(err)
	}
	helperPath := anotherBuildOf(t, realHelper)
	c := newCluster(t, duoflow.HelperConfigFor(helperPath))
	// The outside world is up (from here): a pod that cannot reach it is stopped by its policy.
	if resp, err := http.Get(localcluster.OutsideURL); err != nil {
		t.Fatalf("positive control: %s is not answering from this machine: %v", localcluster.OutsideURL, err)
	} else {
		resp.Body.Close()
	}
	inst, base := duoInstance(t)

	first := inst.Job(base, ciImage)
	res1 := runDuoJob(t, c, inst, first)
	mustContain(t, "job 1 trace", res1.Trace,
		"Sandbox ready: pool duo-default", "helper: /tmp/.sandbox-executor/bin/gitlab-runner",
		"Fetching changes with git depth set to 1", "before npm install: node_modules absent",
		"tests passed: welcome, farewell", "Creating cache "+duoflow.CacheKey, "Created cache",
		"Uploading artifacts", "egress to the instance: allowed", "egress outside: blocked")
	cacheKeys := inst.Cache.Keys()
	if len(cacheKeys) != 1 || !strings.HasSuffix(cacheKeys[0], "/"+duoflow.CacheKey) {
		t.Fatalf("S3 cache objects after job 1: %q, want one for %s", cacheKeys, duoflow.CacheKey)
	}
	if n := inst.NPM.Downloads(duoflow.Dependency); n != 1 {
		t.Errorf("job 1 downloaded %s %d times, want 1", duoflow.Dependency, n)
	}

	second := inst.Job(base, ciImage)
	res2 := runDuoJob(t, c, inst, second)
	mustContain(t, "job 2 trace", res2.Trace,
		"Checking cache for "+duoflow.CacheKey, "Successfully extracted cache",
		"before npm install: node_modules/tiny-greet present", "tests passed: welcome, farewell", "egress outside: blocked")
	if n := inst.NPM.Downloads(duoflow.Dependency); n != 1 {
		t.Errorf("%s downloaded %d times in all, want 1: job 2 should have used the restored node_modules", duoflow.Dependency, n)
	}
	var cacheGets int
	for _, r := range inst.Cache.Requests() {
		if r.Method == http.MethodGet && r.Status == http.StatusOK {
			cacheGets++
		}
	}
	if cacheGets != 1 {
		t.Errorf("S3 cache served %d downloads, want 1 (job 2's restore): %+v", cacheGets, inst.Cache.Requests())
	}

	for _, tc := range []struct {
		job fakegitlab.Job
		res fakegitlab.Result
	}{{first, res1}, {second, res2}} {
		branch := duoflow.Branch(tc.job.ID)
		pushed := assertPushed(t, inst, branch, base)
		assertArtifact(t, tc.res, "pushed "+pushed+" on "+branch)
		for _, v := range tc.job.Variables {
			if v.Masked && strings.Contains(tc.res.Trace, v.Value) {
				t.Errorf("job %d: the value of %s appears in the trace", tc.job.ID, v.Key)
			}
		}
		c.WaitJobGone(t, tc.job.ID)
		if baked := helperBaked.FindStringSubmatch(tc.res.Trace); baked != nil {
			t.Errorf("job %d: prepare linked the baked runner helper (sha256 %s…), want a copy of helper_binary %s, whose sha256 is not the baked one's", tc.job.ID, baked[1], helperPath)
			continue
		}
		if !strings.Contains(tc.res.Trace, "is not this runner's") {
			t.Errorf("job %d: no warning that the runner helper baked in the pod is not this runner's: the local pools' agent image should carry the runner's own helper (tests/cluster/images.sh)", tc.job.ID)
		}
		copied := helperCopied.FindStringSubmatch(tc.res.Trace)
		if copied == nil {
			t.Errorf("job %d: no helper copy line in the trace", tc.job.ID)
			continue
		}
		if !strings.HasPrefix(copied[1], helperPath+",") {
			t.Errorf("job %d: copied the helper %s, want %s", tc.job.ID, copied[1], helperPath)
		}
		t.Logf("job %d: %s in %s (handed out -> final state); helper (%s) copied in %s; %s",
			tc.job.ID, tc.res.State, tc.res.Duration().Round(time.Millisecond), copied[1], copied[2], sandboxReady.FindString(tc.res.Trace))
	}
}

// anotherBuildOf is a copy of helper with bytes appended: it runs the same, but its sha256 is
// not the baked helper's, as another build's would not be.
func anotherBuildOf(t testing.TB, helper string) string {
	t.Helper()
	src, err := os.Open(helper)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	path := filepath.Join(t.TempDir(), runner.HelperBinaryName)
	dst, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.Copy(dst, src)
	if err == nil {
		_, err = dst.WriteString("another build\n")
	}
	if err := errors.Join(err, dst.Close()); err != nil {
		t.Fatal(err)
	}
	return path
}

// assertHelperBaked checks that prepare linked the runner's helper baked into the job's pod,
// rather than copying it: the local pools' agent image carries the runner's own helper
// (runner.HelperPath's, tests/cluster/images.sh), and the job's runner has it as helper_binary.
func assertHelperBaked(t *testing.T, jobID int64, trace string) {
	t.Helper()
	helper, err := runner.HelperPath()
	if err != nil {
		t.Fatal(err)
	}
	digest, err := executor.HelperDigest(helper)
	if err != nil {
		t.Fatal(err)
	}
	baked := helperBaked.FindStringSubmatch(trace)
	switch {
	case baked == nil && strings.Contains(trace, "is not this runner's"):
		t.Errorf("job %d: the local pools' agent image carries another runner helper than %s (sha256 %s…): bring the cluster up with this one (make cluster-up, tests/cluster/images.sh runner_helper)", jobID, helper, digest[:12])
	case baked == nil:
		t.Errorf("job %d: prepare did not link the runner helper baked in the pod (%v)", jobID, helperCopied.FindString(trace))
	case baked[1] != digest[:12]:
		t.Errorf("job %d: linked a baked helper with sha256 %s…, want %s's %s…", jobID, baked[1], helper, digest[:12])
	case helperCopied.MatchString(trace):
		t.Errorf("job %d: prepare both linked and copied the runner helper", jobID)
	default:
		t.Logf("job %d: runner helper baked in the pod (sha256 %s…), checked and linked in %s", jobID, baked[1], baked[2])
	}
}

// duoInstance starts a flow's GitLab instance, closed when the test ends, and pushes its
// project; it returns the instance and the project's commit.
func duoInstance(t *testing.T) (*duoflow.Instance, string) {
	t.Helper()
	inst, err := duoflow.NewInstance()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(inst.Close)
	base, err := inst.CreateProject()
	if err != nil {
		t.Fatal(err)
	}
	return inst, base
}

// assertPushed checks that branch arrived in the bare repository: one commit on top of base,
// by the agent, with the change and nothing else. It returns the pushed commit.
func assertPushed(t *testing.T, inst *duoflow.Instance, branch, base string) string {
	t.Helper()
	parent, err := inst.Repos.RepoGit(duoflow.Project, "rev-parse", branch+"~1")
	if err != nil || parent != base {
		t.Errorf("branch %s: parent %q (%v), want the job's commit %s", branch, parent, err, base)
		return ""
	}
	author, _ := inst.Repos.RepoGit(duoflow.Project, "log", "-1", "--format=%an: %s", branch)
	files, _ := inst.Repos.RepoGit(duoflow.Project, "diff", "--name-only", base, branch)
	code, _ := inst.Repos.RepoGit(duoflow.Project, "show", branch+":index.js")
	if author != "Duo Agent: Duo: "+duoflow.Goal || files != "index.js\ntest.js" || !strings.Contains(code, "farewell: name => 'Goodbye, ' + name + '!'") {
		t.Errorf("branch %s: commit %q changing %q; index.js:\n%s", branch, author, files, code)
	}
	head, _ := inst.Repos.RepoGit(duoflow.Project, "rev-parse", branch)
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
