//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"

	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/runner"
)

// The jobs of this file run through the real gitlab-runner (17.9.0 unless
// SANDBOX_EXECUTOR_GITLAB_RUNNER says otherwise, see tests/runner), `run-single` against the
// fake GitLab on loopback, with sandbox-executor as its custom executor on the local cluster.

// realRunnerTimeout bounds one job through the real runner: a claim from a warm pool, a few
// stages, cleanup until the pod is deleted, on a busy 2-CPU machine.
const realRunnerTimeout = 4 * time.Minute

// startRunner starts `gitlab-runner run-single` for one job of gitlab with def as its custom
// executor; the test stops it at the end if it is still running.
func startRunner(t testing.TB, gitlab *fakegitlab.Server, def runner.CustomExecutor) *runner.Process {
	t.Helper()
	proc, err := runner.Start(runner.Options{URL: gitlab.URL(), Token: gitlab.RunnerToken(), Executor: def})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proc.Stop() })
	return proc
}

// waitJob waits for the job's final state, and fails the test with the runner's log and the
// trace so far if it does not come within realRunnerTimeout.
func waitJob(t testing.TB, gitlab *fakegitlab.Server, proc *runner.Process, id int64) fakegitlab.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), realRunnerTimeout)
	defer cancel()
	res, err := gitlab.Wait(ctx, id)
	if err != nil {
		t.Fatalf("%v\ntrace so far:\n%s\nrunner log:\n%s", err, res.Trace, proc.Log())
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("job %d: %s (%s), trace:\n%s\nrunner log:\n%s", id, res.State, res.FailureReason, res.Trace, proc.Log())
		}
	})
	return res
}

// waitTrace waits until text is in the job's trace, i.e. has reached GitLab.
func waitTrace(t testing.TB, gitlab *fakegitlab.Server, proc *runner.Process, id int64, text string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), realRunnerTimeout)
	defer cancel()
	if res, err := gitlab.WaitForTrace(ctx, id, text); err != nil {
		t.Fatalf("%v\ntrace so far:\n%s\nrunner log:\n%s", err, res.Trace, proc.Log())
	}
}

// runJob runs job through a real runner with def, waits for its final state and for its
// claim, sandbox and pod to be gone.
func runJob(t testing.TB, c *clusterjobs.Runner, def runner.CustomExecutor, gitlab *fakegitlab.Server, job fakegitlab.Job) fakegitlab.Result {
	t.Helper()
	gitlab.Enqueue(job)
	res := waitJob(t, gitlab, startRunner(t, gitlab, def), job.ID)
	c.WaitJobGone(t, job.ID)
	return res
}

func exitCode(code *int) string {
	if code == nil {
		return "none"
	}
	return strconv.Itoa(*code)
}

// jobPod is the pod of a running job of runner r, followed from its claim with admin rights.
func jobPod(t testing.TB, r *clusterjobs.Runner, job fakegitlab.Job) string {
	id := job.ID
	t.Helper()
	ctx := context.Background()
	claim, err := r.Admin.Extensions.ExtensionsV1beta1().SandboxClaims(namespace).Get(ctx, kube.ClaimName(job.Token, r.Name, id), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("job %d: its claim: %v", id, err)
	}
	return podOfClaim(t, r.Cluster, claim)
}

// podOfClaim is the pod of the sandbox a claim holds, followed with admin rights.
func podOfClaim(t testing.TB, c *clusterjobs.Cluster, claim *extv1beta1.SandboxClaim) string {
	t.Helper()
	name := clusterjobs.SandboxOfClaim(t, c.Admin, claim)
	sbx, err := c.Admin.Sandboxes.AgentsV1beta1().Sandboxes(claim.Namespace).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("claim %s: its sandbox %q: %v", claim.Name, name, err)
	}
	if name := sbx.Annotations[sandboxv1beta1.SandboxPodNameAnnotation]; name != "" {
		return name
	}
	return sbx.Name
}

// wrappedExecutor is the runner's custom executor section for r, with every executable called
// through a shell wrapper that notes the stage and its SANDBOX_EXECUTOR_NAMESPACE (config_exec's
// job_env), and as its wrapping says, holds cleanup_exec until the test lets it go, so that the
// test can look into the pod after the runner ended the job's last stage and before the pod is
// deleted, and keeps what each executable printed.
type wrappedExecutor struct {
	Definition runner.CustomExecutor
	dir        string
}

// wrapping is what the wrapper of wrapExecutor does besides noting each stage.
type wrapping struct {
	holdCleanup bool
	// captureOutput keeps each executable's stdout and stderr, in order, as the runner gets them
	// before it masks anything. The runner then gets an executable's output when it exits (no
	// live log), and a signal reaches the wrapper, not the executable: not for cancel tests.
	captureOutput bool
}

func wrapExecutor(t testing.TB, r *clusterjobs.Runner, how wrapping) *wrappedExecutor {
	t.Helper()
	w := &wrappedExecutor{dir: t.TempDir()}
	hold := ""
	if how.holdCleanup {
		hold = `if [ "$3" = cleanup ]; then
	: >"$dir/cleanup-held"
	while [ ! -e "$dir/cleanup-go" ]; do sleep 0.05; done
fi
`
	}
	run := fmt.Sprintf("exec %q \"$@\"\n", r.Binary())
	if how.captureOutput {
		run = fmt.Sprintf(`%q "$@" >"$dir/output.$$" 2>&1
code=$?
cat "$dir/output.$$"
exit $code
`, r.Binary())
	}
	script := fmt.Sprintf(`#!/bin/sh
# called as: wrapper --config <path> <stage> [<script> <runner stage>]
dir=%q
if [ "$3" = run ]; then stage="run $5"; else stage=$3; fi
echo "$stage SANDBOX_EXECUTOR_NAMESPACE=${SANDBOX_EXECUTOR_NAMESPACE-unset}" >>"$dir/stages"
%s%s`, w.dir, hold, run)
	wrapper := filepath.Join(w.dir, "wrapper")
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	def := r.Definition()
	def.ConfigExec, def.PrepareExec, def.RunExec, def.CleanupExec = wrapper, wrapper, wrapper, wrapper
	w.Definition = def
	if how.holdCleanup {
		t.Cleanup(w.ReleaseCleanup) // whatever happens to the test
	}
	return w
}

// Output is what the executables printed, with captureOutput: every stage's, unmasked.
func (w *wrappedExecutor) Output(t testing.TB) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(w.dir, "output.*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no output captured in %s (%v)", w.dir, err)
	}
	var out strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out.Write(data)
	}
	return out.String()
}

// Stages are the executables the runner called, in order, each with the job_env it saw.
func (w *wrappedExecutor) Stages(t testing.TB) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(w.dir, "stages"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(data)), "\n")
}

// WaitCleanupHeld waits until the runner has called cleanup_exec, which the wrapper holds.
func (w *wrappedExecutor) WaitCleanupHeld(t testing.TB, proc *runner.Process) {
	t.Helper()
	for deadline := time.Now().Add(realRunnerTimeout); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(w.dir, "cleanup-held")); err == nil {
			return
		}
		select {
		case <-proc.Exited():
			t.Fatalf("the runner exited without calling cleanup_exec:\n%s", proc.Log())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the runner did not call cleanup_exec within %s:\n%s", realRunnerTimeout, proc.Log())
		}
	}
}

// ReleaseCleanup lets the held cleanup_exec go on.
func (w *wrappedExecutor) ReleaseCleanup() {
	_ = os.WriteFile(filepath.Join(w.dir, "cleanup-go"), nil, 0o644)
}

// Marker processes: a job starts `sleep $MARKER_SECONDS` processes, with a value unique to the
// test process and job, and procScan (eval'd) counts in $found the processes running it and
// lists them. Its own text does not contain the value, so a scan never finds itself.
const procScan = `found=0; for p in /proc/[0-9]*; do c=$(tr '\0' ' ' 2>/dev/null < "$p/cmdline") || continue; ` +
	`case "$c" in *"sleep $MARKER_SECONDS"*) found=$((found+1)); echo "marker process: ${p#/proc/} $c";; esac; done`

func markerSeconds(id int64) string { return fmt.Sprintf("86399.%d%d", os.Getpid(), id) }

// markerVariables are a job's MARKER_SECONDS and PROC_SCAN (raw: the runner would expand the
// scan's $p and $c).
func markerVariables(id int64) []fakegitlab.Variable {
	return []fakegitlab.Variable{
		{Key: "MARKER_SECONDS", Value: markerSeconds(id), Public: true},
		{Key: "PROC_SCAN", Value: procScan, Public: true, Raw: true},
	}
}

// markerScript starts two marker processes (one in a child shell), waits until the scan sees
// both, says so, and prints a tick every second until it is stopped: the ticks make the runner
// patch the trace, whose answer is how it hears of a cancel.
var markerScript = []string{
	`sleep "$MARKER_SECONDS" &`,
	`sh -c 'sleep "$MARKER_SECONDS"' &`,
	`until eval "$PROC_SCAN" >/dev/null; [ "$found" -ge 2 ]; do sleep 0.1; done`,
	`echo "build-started with $found marker processes"`,
	`while :; do echo tick; sleep 1; done`,
}

const buildStarted = "build-started with 2 marker processes"

// podMarkers scans the job's pod for its marker processes from outside the job, with admin rights.
func podMarkers(t testing.TB, r *clusterjobs.Runner, pod string, id int64) (int, string) {
	t.Helper()
	out, err := r.Exec(context.Background(), pod, "sh", "-c", `MARKER_SECONDS=$1; `+procScan+`; echo "found=$found"`, "sh", markerSeconds(id))
	if err != nil {
		t.Fatalf("scanning pod %s: %v\n%s", pod, err, out)
	}
	i := strings.LastIndex(out, "found=")
	if i < 0 {
		t.Fatalf("scanning pod %s: no count in %q", pod, out)
	}
	n, err := strconv.Atoi(strings.TrimSpace(out[i+len("found="):]))
	if err != nil {
		t.Fatalf("scanning pod %s: %q", pod, out)
	}
	return n, out
}

// TestRealRunnerJob runs a job through the real gitlab-runner and checks what GitLab got: the
// job succeeded, ran under gVisor without a service account token, taken by the runner binary
// the suite uses; the job log closes with the executor's summary.
func TestRealRunnerJob(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	gitlab := fakegitlab.New()
	defer gitlab.Close()
	job := gitlab.NewJob(fakegitlab.JobSpec{
		Image:       ciImage,
		GitStrategy: "none",
		Script:      []string{"echo hello from $(uname -s) $(uname -r)", "dmesg | grep -m1 gVisor", `echo "sa-token-$(test -e /var/run/secrets/kubernetes.io/serviceaccount/token && echo mounted || echo absent)"`},
	})
	res := runJob(t, c, c.Definition(), gitlab, job)
	if res.State != fakegitlab.StateSuccess || res.ExitCode != nil {
		t.Fatalf("state %s (%s), exit code %s; want success without an exit code", res.State, res.FailureReason, exitCode(res.ExitCode))
	}
	mustContain(t, "trace", res.Trace, "hello from Linux", "Starting gVisor", "sa-token-absent", "Sandbox ready: pool duo-default", "Job succeeded", "Sandbox summary: ")
	binary, err := runner.BinaryPath()
	if err != nil {
		t.Fatal(err)
	}
	version, err := runner.Version(binary)
	if err != nil {
		t.Fatal(err)
	}
	if res.Runner.Version != version || !strings.Contains(res.Trace, "Running with gitlab-runner "+version) {
		t.Errorf("job run by gitlab-runner %q, want %s (%s)", res.Runner.Version, version, binary)
	}
	t.Logf("gitlab-runner %s: job %d in %s (handed out -> final state)", version, job.ID, res.Duration().Round(time.Millisecond))
}

// TestGVisorJobStreamsLive checks that a job's output reaches GitLab while the job runs: the
// script prints a marker and then waits for a file that the test creates in the pod only once
// the marker is in GitLab's trace.
func TestGVisorJobStreamsLive(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	gitlab := fakegitlab.New()
	defer gitlab.Close()
	job := gitlab.NewJob(fakegitlab.JobSpec{
		Image:       ciImage,
		GitStrategy: "none",
		Script: []string{"uname -r", "dmesg | head -n 2", "echo first-marker",
			"until [ -e /tmp/e2e-go-on ]; do sleep 0.2; done", "echo second-marker"},
	})
	gitlab.Enqueue(job)
	proc := startRunner(t, gitlab, c.Definition())
	waitTrace(t, gitlab, proc, job.ID, "\nfirst-marker\n") // the output, not the echoed command
	// The script cannot go on until now: its first output was streamed while it ran.
	if out, err := c.Exec(context.Background(), jobPod(t, c, job), "touch", "/tmp/e2e-go-on"); err != nil {
		t.Fatalf("letting the job go on: %v %s", err, out)
	}
	res := waitJob(t, gitlab, proc, job.ID)
	if res.State != fakegitlab.StateSuccess {
		t.Fatalf("state %s (%s)", res.State, res.FailureReason)
	}
	mustContain(t, "trace", res.Trace, "Starting gVisor", "runtime gvisor", "Sandbox ready: pool duo-default", "\nsecond-marker\n")
	c.WaitJobGone(t, job.ID)
}

// TestFailingScriptIsBuildFailure: a script that exits 3 fails the job as a script failure, and
// the final update carries exit code 3 (through BUILD_EXIT_CODE_FILE), not a system failure.
func TestFailingScriptIsBuildFailure(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	gitlab := fakegitlab.New()
	defer gitlab.Close()
	job := gitlab.NewJob(fakegitlab.JobSpec{Image: ciImage, GitStrategy: "none", Script: []string{"echo about to fail", "exit 3", "echo not reached"}})
	res := runJob(t, c, c.Definition(), gitlab, job)
	if res.State != fakegitlab.StateFailed || res.FailureReason != fakegitlab.FailureScript || exitCode(res.ExitCode) != "3" {
		t.Fatalf("state %s reason %s exit code %s, want failed %s 3", res.State, res.FailureReason, exitCode(res.ExitCode), fakegitlab.FailureScript)
	}
	mustContain(t, "trace", res.Trace, "\nabout to fail\n", "ERROR: Job failed: exit status 3")
	if strings.Contains(res.Trace, "\nnot reached\n") {
		t.Error("the script went on after exit 3")
	}
}

// TestAfterScriptFailureKeepsScriptExitCode: BUILD_EXIT_CODE_FILE is rewritten on every failing
// stage. The script exits 3, after_script exits 9: the runner's after_script warning names 9
// (read from the file after after_script), the job still fails with the script's 3.
func TestAfterScriptFailureKeepsScriptExitCode(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	gitlab := fakegitlab.New()
	defer gitlab.Close()
	job := gitlab.NewJob(fakegitlab.JobSpec{Image: ciImage, GitStrategy: "none",
		Script:      []string{"echo script fails", "exit 3"},
		AfterScript: []string{`echo "after_script sees CI_JOB_STATUS=$CI_JOB_STATUS"`, "exit 9"}})
	res := runJob(t, c, c.Definition(), gitlab, job)
	if res.State != fakegitlab.StateFailed || res.FailureReason != fakegitlab.FailureScript || exitCode(res.ExitCode) != "3" {
		t.Fatalf("state %s reason %s exit code %s, want failed %s 3", res.State, res.FailureReason, exitCode(res.ExitCode), fakegitlab.FailureScript)
	}
	mustContain(t, "trace", res.Trace, "after_script sees CI_JOB_STATUS=failed",
		"after_script failed, but job will continue unaffected: exit status 9", "ERROR: Job failed: exit status 3")
}

// TestGracefulCancelLeavesNoProcess cancels a job mid-stage as GitLab's cancel button does
// (Job-Status: canceling). The runner stops the stage; after_script runs with
// CI_JOB_STATUS=canceled and finds none of the stage's processes in the pod, and neither does
// a look into the pod from outside once the runner has moved on to cleanup.
func TestGracefulCancelLeavesNoProcess(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	wrapped := wrapExecutor(t, c, wrapping{holdCleanup: true})
	gitlab := fakegitlab.New()
	defer gitlab.Close()
	id := fakegitlab.NextJobID()
	job := gitlab.NewJob(fakegitlab.JobSpec{ID: id, Image: ciImage, GitStrategy: "none",
		Variables: markerVariables(id),
		Script:    markerScript,
		AfterScript: []string{`echo "after_script sees CI_JOB_STATUS=$CI_JOB_STATUS"`,
			`eval "$PROC_SCAN"; echo "after_script found $found marker processes"`}})
	gitlab.Enqueue(job)
	proc := startRunner(t, gitlab, wrapped.Definition)
	waitTrace(t, gitlab, proc, id, buildStarted)
	pod := jobPod(t, c, job)
	if n, out := podMarkers(t, c, pod, id); n != 2 {
		t.Fatalf("the scan from outside finds %d marker processes in pod %s while the stage runs, want 2:\n%s", n, pod, out)
	}

	if err := gitlab.CancelGracefully(id); err != nil {
		t.Fatal(err)
	}
	wrapped.WaitCleanupHeld(t, proc)
	n, out := podMarkers(t, c, pod, id)
	wrapped.ReleaseCleanup()
	if n != 0 {
		t.Errorf("after the cancel, %d marker processes are still in pod %s:\n%s", n, pod, out)
	}
	res := waitJob(t, gitlab, proc, id)
	// job_canceled is internal to the runner: GitLab hears unknown_failure.
	if res.State != fakegitlab.StateCanceled || res.ReportedState != fakegitlab.StateFailed || res.FailureReason != fakegitlab.FailureUnknown {
		t.Errorf("state %s, reported %s (%s); want canceled, reported failed (%s)", res.State, res.ReportedState, res.FailureReason, fakegitlab.FailureUnknown)
	}
	mustContain(t, "trace", res.Trace, "script canceled externally", "after_script sees CI_JOB_STATUS=canceled", "after_script found 0 marker processes")
	c.WaitJobGone(t, id)
}

// TestJobTimeoutLeavesNoProcess runs a script that never ends under a 90 s job timeout
// (runner_info.timeout): the runner fails the job with job_execution_timeout, and when it moves
// on to cleanup none of the script's processes is left in the pod.
func TestJobTimeoutLeavesNoProcess(t *testing.T) {
	t.Parallel()
	// The timeout spans the whole job, prepare too, which beside concurrent tests may be a cold start.
	const timeout = 90 * time.Second
	c := newCluster(t)
	wrapped := wrapExecutor(t, c, wrapping{holdCleanup: true})
	gitlab := fakegitlab.New()
	defer gitlab.Close()
	id := fakegitlab.NextJobID()
	job := gitlab.NewJob(fakegitlab.JobSpec{ID: id, Image: ciImage, GitStrategy: "none", Timeout: timeout,
		Variables: markerVariables(id), Script: markerScript})
	gitlab.Enqueue(job)
	proc := startRunner(t, gitlab, wrapped.Definition)
	waitTrace(t, gitlab, proc, id, buildStarted)
	pod := jobPod(t, c, job)
	if n, out := podMarkers(t, c, pod, id); n != 2 {
		t.Fatalf("the scan from outside finds %d marker processes in pod %s while the stage runs, want 2:\n%s", n, pod, out)
	}

	wrapped.WaitCleanupHeld(t, proc)
	n, out := podMarkers(t, c, pod, id)
	wrapped.ReleaseCleanup()
	if n != 0 {
		t.Errorf("after the timeout, %d marker processes are still in pod %s:\n%s", n, pod, out)
	}
	res := waitJob(t, gitlab, proc, id)
	if res.State != fakegitlab.StateFailed || res.FailureReason != fakegitlab.FailureTimeout {
		t.Errorf("state %s (%s), want failed (%s)", res.State, res.FailureReason, fakegitlab.FailureTimeout)
	}
	mustContain(t, "trace", res.Trace, "execution took longer than "+timeout.String())
	if d := res.Duration(); d < timeout {
		t.Errorf("the job ended %s after hand-out, before its %s timeout", d.Round(time.Millisecond), timeout)
	}
	c.WaitJobGone(t, id)
}

// TestMaskedVariablesNeverInTrace: a masked variable reaches the script, and its value appears
// nowhere in the job log, whoever prints it (the script, env, the job token too).
func TestMaskedVariablesNeverInTrace(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	gitlab := fakegitlab.New()
	defer gitlab.Close()
	random := make([]byte, 12)
	_, _ = rand.Read(random)
	secret := "e2e-masked-" + hex.EncodeToString(random)
	job := gitlab.NewJob(fakegitlab.JobSpec{Image: ciImage, GitStrategy: "none",
		Variables: []fakegitlab.Variable{{Key: "E2E_SECRET", Value: secret, Masked: true}},
		Script: []string{
			`echo "secret is $E2E_SECRET"`,
			`echo "secret length ${#E2E_SECRET}"`,
			`env | grep '^E2E_SECRET='`,
			`echo "job token is $CI_JOB_TOKEN"`,
		}})
	res := runJob(t, c, c.Definition(), gitlab, job)
	if res.State != fakegitlab.StateSuccess {
		t.Fatalf("state %s (%s)", res.State, res.FailureReason)
	}
	mustContain(t, "trace", res.Trace, "secret is [MASKED]", fmt.Sprintf("secret length %d", len(secret)), "E2E_SECRET=[MASKED]")
	for _, v := range job.Variables {
		if v.Masked && strings.Contains(res.Trace, v.Value) {
			t.Errorf("the value of masked variable %s is in the trace", v.Key)
		}
	}
}

// TestJobEnvReachesEveryStage: the job_env config_exec returns (SANDBOX_EXECUTOR_NAMESPACE) is
// in the environment of every later executable the runner calls: prepare, each run, cleanup.
func TestJobEnvReachesEveryStage(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	wrapped := wrapExecutor(t, c, wrapping{})
	gitlab := fakegitlab.New()
	defer gitlab.Close()
	job := gitlab.NewJob(fakegitlab.JobSpec{Image: ciImage, GitStrategy: "none",
		Script:      []string{`echo "the script sees SANDBOX_EXECUTOR_NAMESPACE=${SANDBOX_EXECUTOR_NAMESPACE-unset}"`},
		AfterScript: []string{"echo after"}})
	res := runJob(t, c, wrapped.Definition, gitlab, job)
	if res.State != fakegitlab.StateSuccess {
		t.Fatalf("state %s (%s)", res.State, res.FailureReason)
	}
	want := " SANDBOX_EXECUTOR_NAMESPACE=" + namespace
	wantStages := []string{"config SANDBOX_EXECUTOR_NAMESPACE=unset", "prepare" + want, "run prepare_script" + want,
		"run get_sources" + want, "run build_script" + want, "run after_script" + want, "run cleanup_file_variables" + want, "cleanup" + want}
	if got := wrapped.Stages(t); strings.Join(got, "\n") != strings.Join(wantStages, "\n") {
		t.Errorf("executables called:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(wantStages, "\n"))
	}
	for _, line := range strings.Split(res.Trace, "\n") {
		if strings.HasPrefix(line, "the script sees") {
			t.Logf("%s (job_env is the executables' environment, not the job's)", line)
		}
	}
}
