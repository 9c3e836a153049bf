//go:build e2e

// Package e2e runs real jobs through sandbox-executor on the real local cluster (make
// cluster-up): kube-apiserver, the agent-sandbox controller, gVisor pods, and the real
// gitlab-runner against a fake GitLab API on loopback. tests/harness/clusterjobs drives the jobs and
// checks what they leave behind.
package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
)

func TestMain(m *testing.M) { clusterjobs.SuiteMain(m, "e2e") }

const (
	namespace = clusterjobs.Namespace
	pool      = localcluster.Pool
	ciImage   = localcluster.CIImage
)

// The job token and a Duo secret every job's stages get (CI_JOB_TOKEN and
// DUO_WORKFLOW_SERVICE_TOKEN), which must never appear in our output.
const (
	jobToken = "glcbt-e2e-secret-token"
	duoToken = "duo-e2e-secret"
)

// The suite's bounds for one job: its tests run concurrently (-parallel, see tests/README.md),
// so on the 2-core local node a job's sandbox may be a cold start that waits in Pending behind
// other jobs' pods, and its deletion waits for a busy kubelet.
const (
	// readyTimeout is prepare's ready_timeout unless cfg sets one: as long as a real runner lets
	// prepare_exec run (localcluster.CustomExecutor), and as the stage server tests wait.
	readyTimeout = "3m"
	// goneTimeout is how long cleanup may take for the job's claim, sandbox and pod to be gone.
	goneTimeout = 2 * time.Minute
)

// newRunner is the suite's executor configuration on c: runner e2e-PID, prepare waits at most
// readyTimeout for a sandbox (unless cfg says otherwise) and cleanup at most goneTimeout for the
// job to be gone; cfg's other fields as given.
func newRunner(t testing.TB, c *clusterjobs.Cluster, cfg localcluster.Config) *clusterjobs.Runner {
	t.Helper()
	if cfg.ReadyTimeout == "" {
		cfg.ReadyTimeout = readyTimeout
	}
	r := c.NewRunnerWith(t, "e2e", cfg)
	r.GoneTimeout = goneTimeout
	return r
}

// newCluster checks the local cluster is up and writes the suite's executor configuration for
// deploy/local's pools, with extra lines added to its top-level keys.
func newCluster(t testing.TB, extra ...string) *clusterjobs.Runner {
	t.Helper()
	return newRunner(t, clusterjobs.Connect(t), localcluster.Config{Extra: strings.Join(extra, "\n")})
}

// runPath is how the runner starts run: sandbox-executor in its own process (run_exec naming
// it, the old path), or the stage launcher handing it to the stage server (the chart's default).
type runPath struct {
	name   string
	served bool
}

// runPaths are both: the tests of a run stage's faults run on each.
var runPaths = []runPath{{"direct", false}, {"served", true}}

// onEachRunPath runs f as a subtest per run path.
func onEachRunPath(t *testing.T, f func(t *testing.T, path runPath)) {
	for _, path := range runPaths {
		t.Run(path.name, func(t *testing.T) { f(t, path) })
	}
}

// newRunnerOn is newRunner on path: served, with a stage server of its own through which
// prepare, run and cleanup go, as the chart deploys it.
func newRunnerOn(t testing.TB, c *clusterjobs.Cluster, cfg localcluster.Config, path runPath) *clusterjobs.Runner {
	t.Helper()
	if !path.served {
		return newRunner(t, c, cfg)
	}
	if cfg.ReadyTimeout == "" {
		cfg.ReadyTimeout = readyTimeout
	}
	r := c.NewServedRunner(t, "e2e", cfg)
	r.GoneTimeout = goneTimeout
	return r
}

// newClusterOn is newCluster on path.
func newClusterOn(t testing.TB, path runPath, extra ...string) *clusterjobs.Runner {
	t.Helper()
	return newRunnerOn(t, clusterjobs.Connect(t), localcluster.Config{Extra: strings.Join(extra, "\n")}, path)
}

// newJob is a job on image ("": none, for the default pool) with the environment a modern
// runner gives every stage.
func newJob(t testing.TB, r *clusterjobs.Runner, image string) *clusterjobs.Job {
	t.Helper()
	return r.NewJob(t, clusterjobs.JobSpec{Image: image, NoImage: image == "", Token: jobToken,
		RunnerEnv: []string{"CUSTOM_ENV_DUO_WORKFLOW_SERVICE_TOKEN=" + duoToken}})
}

// preparedJob runs config and prepare for a new job on image and registers its cleanup, which
// must leave nothing behind. It returns the job, its pod as prepare's log names it, and that log.
func preparedJob(t testing.TB, r *clusterjobs.Runner, image string) (*clusterjobs.Job, string, string) {
	t.Helper()
	j := newJob(t, r, image)
	prep := j.Prepare(t).Output()
	return j, podFromPrepareLog(t, prep), prep
}

func podFromPrepareLog(t testing.TB, log string) string {
	t.Helper()
	i := strings.Index(log, "pod "+namespace+"/")
	if i < 0 {
		t.Fatalf("prepare log names no pod:\n%s", log)
	}
	rest := log[i+len("pod "+namespace+"/"):]
	return strings.FieldsFunc(rest, func(r rune) bool { return r == ',' || r == ' ' })[0]
}

func mustContain(t testing.TB, what, text string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(text, w) {
			t.Errorf("%s lacks %q:\n%s", what, w, text)
		}
	}
}
