// Package clusterjobs drives real jobs through the sandbox-executor binary on the local cluster
// (make cluster-up), stage by stage and with the environment a runner gives each stage, or
// hands the real runners the custom executor section that runs it, and looks at what jobs leave
// in the cluster with admin rights. The security and e2e suites use it.
package clusterjobs

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/agentca"
	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/stageserver"
	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
	"github.com/sandbox-executor/sandbox-executor/tests/runner"
)

// The exit codes every stage is told to use, as a runner announces them.
const (
	BuildFailure  = 1
	SystemFailure = 2
)

// Namespace is where deploy/local puts the pools and the executor claims.
const Namespace = localcluster.Namespace

// goneTimeout is a runner's GoneTimeout unless the suite sets another: the pod's deletion waits
// for the kubelet, which takes long on a busy node.
const goneTimeout = 2 * time.Minute

// Cluster is the local cluster, our binaries, and admin clients to inspect what jobs leave behind.
type Cluster struct {
	*localcluster.Env
	// Admin has full rights.
	Admin *kube.Clients
	// AdminConfig is an executor configuration with the admin kubeconfig (Admin's).
	AdminConfig string
}

// Connect finds the local cluster and the binaries ($SANDBOX_EXECUTOR_BIN); it fails the test if
// either is missing.
func Connect(t testing.TB) *Cluster {
	t.Helper()
	env, err := localcluster.Find()
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{Env: env, AdminConfig: filepath.Join(t.TempDir(), "admin.toml")}
	text := fmt.Sprintf("kubeconfig = %q\nnamespace = %q\n[[pool]]\nname = %q\n", env.AdminKubeconfig(), Namespace, localcluster.Pool)
	if err := os.WriteFile(c.AdminConfig, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	c.Admin = clients(t, c.AdminConfig)
	return c
}

// clients connects as an executor with the configuration at path does.
func clients(t testing.TB, path string) *kube.Clients {
	t.Helper()
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kube.NewClients(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// RESTConfig is the client configuration of a kubeconfig file, for clients beyond Admin's (or
// with the executor's own rights: ExecutorKubeconfig).
func RESTConfig(t testing.TB, kubeconfig string) *rest.Config {
	t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

// Exec runs a command in a pod's job container with admin rights, to look at the pod from outside
// the job. The output is stdout followed by stderr.
func (c *Cluster) Exec(ctx context.Context, pod string, command ...string) (string, error) {
	var stdout, stderr bytes.Buffer // one buffer each: the streams are copied concurrently
	err := c.Admin.Exec.Exec(ctx, kube.ExecRequest{
		Namespace: Namespace, Pod: pod, Container: "job", Command: command, Stdout: &stdout, Stderr: &stderr,
	})
	return stdout.String() + stderr.String(), err
}

// Runner is one executor configuration, as one runner host would have it.
type Runner struct {
	*Cluster
	Name       string
	ConfigPath string
	// GoneTimeout bounds how long a job's claim, sandbox and pod may take to disappear after
	// cleanup (WaitGone).
	GoneTimeout time.Duration
	// StageServer is the runner's stage server (NewServedRunner), nil without one.
	StageServer *StageServer
	// RunDirect keeps run in its own process beside a stage server (run_exec naming
	// sandbox-executor, the chart's runner.serveRun false); otherwise run goes through the stage
	// launcher like prepare and cleanup.
	RunDirect bool
}

// Pool is a [[pool]] entry of the executor configuration.
type Pool = localcluster.PoolConfig

// readyTimeout is the ready_timeout of NewRunner. Every job pod requests CPU and the node has
// two cores: concurrent jobs wait in Pending for each other, as on a busy cluster, and prepare
// must wait with them.
const readyTimeout = "5m"

// NewRunner writes an executor configuration for the local cluster under a runner name unique to
// this process (prefix-PID), with a ready_timeout for concurrent jobs. With no pools it serves
// deploy/local's pools, the first one the default; extra is added to the top-level keys.
func (c *Cluster) NewRunner(t testing.TB, prefix, extra string, pools ...Pool) *Runner {
	t.Helper()
	return c.NewRunnerWith(t, prefix, localcluster.Config{ReadyTimeout: readyTimeout, Extra: extra, Pools: pools})
}

// NewRunnerWith is NewRunner with the whole configuration given (the runner name is set here);
// what cfg leaves empty has localcluster.Config's defaults.
func (c *Cluster) NewRunnerWith(t testing.TB, prefix string, cfg localcluster.Config) *Runner {
	t.Helper()
	r := &Runner{Cluster: c, Name: prefix + "-" + strconv.Itoa(os.Getpid()), ConfigPath: filepath.Join(t.TempDir(), "config.toml"), GoneTimeout: goneTimeout}
	cfg.RunnerName = r.Name
	if err := c.WriteConfig(r.ConfigPath, cfg); err != nil {
		t.Fatal(err)
	}
	return r
}

// NewServedRunner is NewRunnerWith with a stage server of its own (sandbox-executor serve), as
// the chart's start-runner runs beside gitlab-runner; it stops when the test ends.
func (c *Cluster) NewServedRunner(t testing.TB, prefix string, cfg localcluster.Config) *Runner {
	t.Helper()
	// A short path: a Unix socket's path is limited to 108 bytes, and test directories are long.
	dir, err := os.MkdirTemp("", "stages-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg.StageServer = filepath.Join(dir, "stages.sock")
	r := c.NewRunnerWith(t, prefix, cfg)
	r.StageServer = StartStageServer(t, r.Binary(), r.ConfigPath, cfg.StageServer)
	return r
}

// Definition is the [runners.custom] section of a real runner that runs our binary with this
// runner's configuration; with a stage server, prepare, run (unless RunDirect) and cleanup start
// the stage launcher, as the chart configures them.
func (r *Runner) Definition() runner.CustomExecutor {
	def := r.CustomExecutor(r.ConfigPath)
	if r.StageServer != nil {
		def.PrepareExec, def.CleanupExec = r.StageLauncher(), r.StageLauncher()
		if !r.RunDirect {
			def.RunExec = r.StageLauncher()
		}
	}
	return def
}

// ServesRun says whether run goes through the stage launcher and the stage server.
func (r *Runner) ServesRun() bool { return r.StageServer != nil && !r.RunDirect }

// Clients connects to the cluster as the executor with this runner's configuration does.
func (r *Runner) Clients(t testing.TB) *kube.Clients {
	t.Helper()
	return clients(t, r.ConfigPath)
}

// JobSpec describes a job as GitLab hands it to the runner.
type JobSpec struct {
	// Image is the job's image:; empty means the local CI image, unless NoImage.
	Image string
	// NoImage leaves the job without an image:, for the default pool.
	NoImage bool
	// Variables become CUSTOM_ENV_<KEY> in every stage's environment and the job JSON's variables.
	Variables map[string]string
	// Token is the job token (CI_JOB_TOKEN); empty means a fixed test value.
	Token string
	// ID is the job's ID; 0 means a new one. Jobs of one runner with the same ID (a second GitLab
	// instance) share the claim name only if they share the token (kube.ClaimName is keyed with it).
	ID int64
	// RunnerEnv is added to the runner process's own environment, which every stage inherits.
	RunnerEnv []string
	// Cache and Artifacts are the job JSON's cache: and artifacts: entries; with paths in either,
	// prepare puts the runner's helper (helper_binary) in the pod.
	Cache     []fakegitlab.Cache
	Artifacts []fakegitlab.Artifact
}

// Job is one job, run stage by stage through our binary.
type Job struct {
	*Runner
	ID    int64
	Dir   string // the runner's per-job temporary directory (TMPDIR)
	token string
	env   []string
	// Pod is the job's pod, known after a successful Prepare.
	Pod, PodUID string
	// Results are the job's stages so far, in order.
	Results   []Result
	cleanedUp bool
}

// NewJob gives a job the files and environment a 17.x runner gives its stages: JOB_RESPONSE_FILE,
// TMPDIR, BUILD_EXIT_CODE_FILE, the failure exit codes, and CUSTOM_ENV_ variables.
func (r *Runner) NewJob(t testing.TB, spec JobSpec) *Job {
	t.Helper()
	if spec.Image == "" && !spec.NoImage {
		spec.Image = localcluster.CIImage
	}
	if spec.Token == "" {
		spec.Token = "glcbt-clustertest-token"
	}
	j := &Job{Runner: r, ID: spec.ID, Dir: t.TempDir(), token: spec.Token}
	if j.ID == 0 {
		j.ID = fakegitlab.NextJobID()
	}
	type variable struct {
		Key    string `json:"key"`
		Value  string `json:"value"`
		Masked bool   `json:"masked"`
	}
	vars := []variable{{"CI_JOB_TOKEN", spec.Token, true}, {"CI_PIPELINE_ID", "4242", false}}
	for k, v := range spec.Variables {
		vars = append(vars, variable{k, v, true})
	}
	response, err := json.Marshal(map[string]any{
		"id": j.ID, "token": spec.Token, "job_info": map[string]any{"project_id": 42},
		"runner_info": map[string]any{"timeout": 600}, "image": map[string]any{"name": spec.Image}, "variables": vars,
		"cache": spec.Cache, "artifacts": spec.Artifacts,
	})
	if err != nil {
		t.Fatal(err)
	}
	responseFile := filepath.Join(j.Dir, "response.json")
	if err := os.WriteFile(responseFile, response, 0o600); err != nil {
		t.Fatal(err)
	}
	j.env = append(append(os.Environ(), spec.RunnerEnv...),
		"TMPDIR="+j.Dir, "JOB_RESPONSE_FILE="+responseFile, "BUILD_EXIT_CODE_FILE="+j.ExitCodeFile(),
		"BUILD_FAILURE_EXIT_CODE="+strconv.Itoa(BuildFailure), "SYSTEM_FAILURE_EXIT_CODE="+strconv.Itoa(SystemFailure))
	for _, v := range vars {
		j.env = append(j.env, "CUSTOM_ENV_"+v.Key+"="+v.Value)
	}
	return j
}

// ExitCodeFile is the job's BUILD_EXIT_CODE_FILE, where run leaves a failed script's exit code.
func (j *Job) ExitCodeFile() string { return filepath.Join(j.Dir, "build-exit-code") }

// Command is one stage of our binary with the job's environment, not started.
func (j *Job) Command(args ...string) *exec.Cmd {
	bin := j.Binary()
	if j.StageServer != nil && len(args) > 0 && stageserver.Serves(args[0]) && (args[0] != "run" || !j.RunDirect) {
		bin = j.StageLauncher()
	}
	cmd := exec.Command(bin, append([]string{"--config", j.ConfigPath}, args...)...)
	cmd.Env = j.env
	return cmd
}

// Result is how one stage ended.
type Result struct {
	Stage          string
	Stdout, Stderr string
	// ExitCode is -1 if the process did not exit on its own.
	ExitCode int
	// ScriptExitCode is what run left in BUILD_EXIT_CODE_FILE, -1 if nothing.
	ScriptExitCode int
}

// Output is stdout and stderr, for messages.
func (r Result) Output() string { return r.Stdout + r.Stderr }

// Stage runs one stage of our binary to its end.
func (j *Job) Stage(t testing.TB, args ...string) Result {
	t.Helper()
	os.Remove(j.ExitCodeFile())
	var stdout, stderr bytes.Buffer
	cmd := j.Command(args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := Result{Stage: stageName(args), Stdout: stdout.String(), Stderr: stderr.String(), ExitCode: ExitCode(err), ScriptExitCode: -1}
	if err != nil && res.ExitCode == -1 {
		t.Fatalf("%s: %v", res.Stage, err)
	}
	if data, err := os.ReadFile(j.ExitCodeFile()); err == nil {
		if code, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
			res.ScriptExitCode = code
		}
	}
	j.Results = append(j.Results, res)
	return res
}

// stageName is how a stage is named in messages: run by its runner stage, not its script path.
func stageName(args []string) string {
	if len(args) == 3 && args[0] == "run" {
		return "run " + args[2]
	}
	return strings.Join(args, " ")
}

// MustStage runs a stage and fails the test unless it exits with want.
func (j *Job) MustStage(t testing.TB, want int, args ...string) Result {
	t.Helper()
	res := j.Stage(t, args...)
	if res.ExitCode != want {
		t.Fatalf("job %d: %s exited %d, want %d\n%s", j.ID, res.Stage, res.ExitCode, want, res.Output())
	}
	return res
}

// Prepare runs config and prepare, which must both succeed, and registers the job's cleanup:
// cleanup must succeed and leave nothing of the job behind.
func (j *Job) Prepare(t testing.TB) Result {
	t.Helper()
	j.MustStage(t, 0, "config")
	j.cleanupAtEnd(t)
	res := j.MustStage(t, 0, "prepare")
	j.findPod(t)
	return res
}

// TryPrepare runs config and prepare for a test goroutine, where Fatal must not be called: a
// stage that fails is reported with Errorf, and TryPrepare says whether the job has its pod
// (j.Pod). It registers no cleanup: the caller cleans up.
func (j *Job) TryPrepare(t testing.TB) bool {
	t.Helper()
	for _, stage := range []string{"config", "prepare"} {
		if res := j.Stage(t, stage); res.ExitCode != 0 {
			t.Errorf("job %d: %s exited %d\n%s", j.ID, stage, res.ExitCode, res.Output())
			return false
		}
	}
	if err := j.lookUpPod(); err != nil {
		t.Error(err)
		return false
	}
	return true
}

// cleanupAtEnd cleans the job up at the end of the test unless the test did.
func (j *Job) cleanupAtEnd(t testing.TB) {
	t.Cleanup(func() {
		if !j.cleanedUp {
			j.Cleanup(t)
		}
	})
}

// Cleanup runs cleanup, which must exit 0, then waits until the job's claim, sandbox and pod
// are gone.
func (j *Job) Cleanup(t testing.TB) Result {
	t.Helper()
	j.cleanedUp = true
	res := j.Stage(t, "cleanup")
	if res.ExitCode != 0 {
		t.Errorf("job %d: cleanup exited %d\n%s", j.ID, res.ExitCode, res.Output())
	}
	j.WaitGone(t)
	return res
}

// Script writes a stage script the way the runner does (0700, `trap exit 1 TERM` first).
func (j *Job) Script(t testing.TB, body string) string {
	t.Helper()
	f, err := os.CreateTemp(j.Dir, "script-*.sh")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("trap 'exit 1' TERM\n" + body); err != nil {
		t.Fatal(err)
	}
	if err := f.Chmod(0o700); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}

// Run runs body as the build_script stage and returns how it ended; it does not judge the exit.
func (j *Job) Run(t testing.TB, body string) Result {
	t.Helper()
	return j.Stage(t, "run", j.Script(t, body), "build_script")
}

// MustRun runs body as the build_script stage, which must succeed.
func (j *Job) MustRun(t testing.TB, body string) Result {
	t.Helper()
	return j.MustStage(t, 0, "run", j.Script(t, body), "build_script")
}

// ClaimName is the job's SandboxClaim.
func (j *Job) ClaimName() string { return kube.ClaimName(j.token, j.Runner.Name, j.ID) }

// AgentExecutor is what the job's stages run agent commands with, as its prepare saved them:
// the agent over the pod network (TLS, with a client certificate of the cluster's agent CA for
// this job) with exec behind it, or exec alone. The state says which.
func (j *Job) AgentExecutor(t testing.TB, exec kube.RemoteExecutor) (kube.RemoteExecutor, *executor.JobState) {
	t.Helper()
	state, err := executor.SavedJob(j.Dir, j.ClaimName())
	if err != nil || state == nil {
		t.Fatalf("the job's saved state: %v, %v", state, err)
	}
	ca, err := agentca.Load(j.Env.AgentCA())
	if err != nil {
		t.Fatal(err)
	}
	agent, err := state.Transport.Executor(state.Sandbox, exec, ca, kube.JobBinding(j.token, localcluster.Namespace, j.ClaimName()))
	if err != nil {
		t.Fatal(err)
	}
	return agent, state
}

// SandboxOfClaim names the Sandbox of claim: the one its status names or, before agent-sandbox
// has written that (prepare goes on from the adoption, a status write earlier), the one the claim
// controls (the adoption labels it with the claim's UID).
func SandboxOfClaim(t testing.TB, admin *kube.Clients, claim *extv1beta1.SandboxClaim) string {
	t.Helper()
	name, err := sandboxOfClaim(admin, claim)
	if err != nil {
		t.Fatal(err)
	}
	return name
}

func sandboxOfClaim(admin *kube.Clients, claim *extv1beta1.SandboxClaim) (string, error) {
	if name := claim.Status.SandboxStatus.Name; name != "" {
		return name, nil
	}
	list, err := admin.Sandboxes.AgentsV1beta1().Sandboxes(claim.Namespace).List(context.Background(), metav1.ListOptions{
		LabelSelector: extv1beta1.SandboxIDLabel + "=" + string(claim.UID)})
	if err != nil {
		return "", fmt.Errorf("the sandboxes of claim %s: %v", claim.Name, err)
	}
	for _, sbx := range list.Items {
		if ref := metav1.GetControllerOf(&sbx); ref != nil && ref.UID == claim.UID {
			return sbx.Name, nil
		}
	}
	return "", fmt.Errorf("claim %s names no sandbox and controls none", claim.Name)
}

// findPod follows the job's claim (or, for a cold start of unknown_image = "cold", its Sandbox of
// the claim's name) to its sandbox and pod, with admin rights and without the executor's checks,
// so that it also finds pods the executor refused.
func (j *Job) findPod(t testing.TB) {
	t.Helper()
	if err := j.lookUpPod(); err != nil {
		t.Fatal(err)
	}
}

func (j *Job) lookUpPod() error {
	ctx := context.Background()
	sandboxName := j.ClaimName()
	claim, err := j.Admin.Extensions.ExtensionsV1beta1().SandboxClaims(Namespace).Get(ctx, j.ClaimName(), metav1.GetOptions{})
	switch {
	case err == nil:
		if sandboxName, err = sandboxOfClaim(j.Admin, claim); err != nil {
			return fmt.Errorf("job %d: %v", j.ID, err)
		}
	case !apierrors.IsNotFound(err):
		return fmt.Errorf("job %d: its claim: %v", j.ID, err)
	}
	sbx, err := j.Admin.Sandboxes.AgentsV1beta1().Sandboxes(Namespace).Get(ctx, sandboxName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("job %d: its sandbox %s (no claim: a cold start): %v", j.ID, sandboxName, err)
	}
	pod, err := j.Admin.Kube.CoreV1().Pods(Namespace).Get(ctx, kube.PodNameOf(sbx), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("job %d: pod of sandbox %s: %v", j.ID, sbx.Name, err)
	}
	j.Pod, j.PodUID = pod.Name, string(pod.UID)
	return nil
}

// PrepareRefused runs config and prepare when prepare is expected to fail, registers the
// cleanup, and finds the pod if the claim got one.
func (j *Job) PrepareRefused(t testing.TB) Result {
	t.Helper()
	j.MustStage(t, 0, "config")
	j.cleanupAtEnd(t)
	res := j.Stage(t, "prepare")
	if claim, err := j.Admin.Extensions.ExtensionsV1beta1().SandboxClaims(Namespace).Get(context.Background(), j.ClaimName(), metav1.GetOptions{}); err == nil && claim.Status.SandboxStatus.Name != "" {
		j.findPod(t)
	}
	return res
}

// PodObject is the job's pod as the API server has it.
func (j *Job) PodObject(t testing.TB) *corev1.Pod {
	t.Helper()
	pod, err := j.Admin.Kube.CoreV1().Pods(Namespace).Get(context.Background(), j.Pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// Claim is the job's SandboxClaim as the API server has it.
func (j *Job) Claim(t testing.TB) *extv1beta1.SandboxClaim {
	t.Helper()
	claim, err := j.Admin.Extensions.ExtensionsV1beta1().SandboxClaims(Namespace).Get(context.Background(), j.ClaimName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return claim
}

// WaitJobGone is WaitGone for job id of this runner, run through a real runner rather than by
// Job: its pod is not known, the claim and the sandboxes it owned are checked.
func (r *Runner) WaitJobGone(t testing.TB, id int64) {
	t.Helper()
	(&Job{Runner: r, ID: id}).WaitGone(t)
}

// WaitGone waits until the job's claim (by name, and any claim with the job's labels), the
// sandboxes it owned and its pod are gone, and fails the test with what is left otherwise.
func (j *Job) WaitGone(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	var left []string
	for deadline := time.Now().Add(j.GoneTimeout); ; {
		left = j.leftovers(t, ctx)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Errorf("job %d left behind after cleanup: %s", j.ID, strings.Join(left, " "))
}

func (j *Job) leftovers(t testing.TB, ctx context.Context) []string {
	t.Helper()
	var left []string
	claimsAPI := j.Admin.Extensions.ExtensionsV1beta1().SandboxClaims(Namespace)
	if _, err := claimsAPI.Get(ctx, j.ClaimName(), metav1.GetOptions{}); err == nil {
		left = append(left, "claim/"+j.ClaimName())
	} else if !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	selector := kube.LabelJobID + "=" + strconv.FormatInt(j.ID, 10) + "," + kube.LabelRunner + "=" + kube.RunnerLabel(j.Runner.Name)
	claims, err := claimsAPI.List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range claims.Items {
		if cl.Name != j.ClaimName() {
			left = append(left, "claim/"+cl.Name)
		}
	}
	sandboxes, err := j.Admin.Sandboxes.AgentsV1beta1().Sandboxes(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sandboxes.Items {
		// The claim's sandboxes, and a cold start's Sandbox, which is named like the claim.
		if s.Name == j.ClaimName() || slices.ContainsFunc(s.OwnerReferences, func(o metav1.OwnerReference) bool {
			return o.Kind == "SandboxClaim" && o.Name == j.ClaimName()
		}) {
			left = append(left, "sandbox/"+s.Name)
		}
	}
	if j.Pod != "" {
		pod, err := j.Admin.Kube.CoreV1().Pods(Namespace).Get(ctx, j.Pod, metav1.GetOptions{})
		switch {
		case err == nil && string(pod.UID) == j.PodUID:
			left = append(left, "pod/"+j.Pod)
		case err != nil && !apierrors.IsNotFound(err):
			t.Fatal(err)
		}
	}
	return left
}

// ExitCode is how a process that Run or Wait returned err for exited: -1 if it did not exit
// on its own (or did not start).
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return -1
}

// StageServer is a runner's `sandbox-executor serve` process.
type StageServer struct {
	Socket string
	// Log is what it wrote.
	Log    *testutil.LockedBuffer
	cmd    *exec.Cmd
	copied chan struct{}
	waited bool
	err    error
}

// StartStageServer runs `sandbox-executor serve` for config on socket until the test ends, and
// returns once it says it listens. At the end it is stopped as systemd or the chart's
// start-runner stops it (SIGTERM), and must exit 0, unless the test killed it.
func StartStageServer(t testing.TB, binary, config, socket string) *StageServer {
	t.Helper()
	s := &StageServer{Socket: socket, Log: &testutil.LockedBuffer{}, copied: make(chan struct{})}
	s.cmd = exec.Command(binary, "--config", config, "serve", "--drain", "30s")
	out, err := s.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	s.cmd.Stdout = s.Log
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	first, err := bufio.NewReader(out).ReadString('\n')
	s.Log.Write([]byte(first))
	go func() { defer close(s.copied); _, _ = io.Copy(s.Log, out) }()
	t.Cleanup(func() {
		if s.waited {
			return
		}
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		if err := s.wait(); err != nil {
			t.Errorf("stage server: %v\n%s", err, s.Log)
		}
	})
	if err != nil || first != "stage server: listening on "+socket+"\n" {
		t.Fatalf("stage server did not start: %v\n%s", err, s.Log)
	}
	return s
}

// Kill SIGKILLs the server, as a crash or the OOM killer would, and waits until it is gone.
func (s *StageServer) Kill(t testing.TB) {
	t.Helper()
	if err := s.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := s.wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("stage server: %v after SIGKILL", err)
	}
}

func (s *StageServer) wait() error {
	if !s.waited {
		<-s.copied
		s.err, s.waited = s.cmd.Wait(), true
	}
	return s.err
}
