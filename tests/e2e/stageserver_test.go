//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
)

// A job through gitlab-runner 17.9 with a stage server, as the chart deploys it: prepare, run and
// cleanup run in the server (its log says so), and the job is the same as without one; with
// run_exec naming sandbox-executor (the chart's runner.serveRun false), run stages keep their
// own processes. The job's masked variable never reaches the server's log.
func TestRealRunnerJobThroughTheStageServer(t *testing.T) {
	t.Parallel()
	onEachRunPath(t, testRealRunnerJobThroughTheStageServer)
}

func testRealRunnerJobThroughTheStageServer(t *testing.T, path runPath) {
	c := clusterjobs.Connect(t)
	r := c.NewServedRunner(t, "e2e-served", localcluster.Config{ReadyTimeout: "3m"})
	r.RunDirect = !path.served
	gitlab := fakegitlab.New()
	defer gitlab.Close()
	const secret = "served-s3cr3t-value-4711"
	job := gitlab.NewJob(fakegitlab.JobSpec{
		Image:       ciImage,
		GitStrategy: "none",
		Script:      []string{"echo hello from $(uname -r)", `test "$SERVED_SECRET" = ` + secret + ` && echo the secret reached the job`},
		Variables:   []fakegitlab.Variable{{Key: "SERVED_SECRET", Value: secret, Masked: true}},
	})
	res := runJob(t, r, r.Definition(), gitlab, job)
	if res.State != fakegitlab.StateSuccess {
		t.Fatalf("job %d: %s (%s)", job.ID, res.State, res.FailureReason)
	}
	mustContain(t, "trace", res.Trace, "hello from 4.", "the secret reached the job", "Sandbox ready: pool duo-default", "Sandbox summary: ")
	if strings.Contains(res.Trace, "runs in its own process") {
		t.Errorf("a stage did not reach the stage server:\n%s", res.Trace)
	}
	log := r.StageServer.Log.String()
	mustContain(t, "stage server log", log, "prepare exited 0", "cleanup exited 0")
	if path.served {
		mustContain(t, "stage server log", log, "run exited 0")
	} else if strings.Contains(log, "run exited") {
		t.Errorf("run_exec names sandbox-executor, yet a run stage went through the server:\n%s", log)
	}
	if strings.Contains(log, secret) {
		t.Errorf("the stage server's log has the job's secret:\n%s", log)
	}
}

// With the stage server down, the stage launcher that prepare_exec and cleanup_exec name becomes
// the executor (execve, the same arguments and environment): the job succeeds as without a
// server, and its log says once per stage why it was slower (run stages, which the executor runs
// in its own process anyway when run_exec names it, say nothing).
func TestRealRunnerJobWithTheStageServerDown(t *testing.T) {
	t.Parallel()
	c := clusterjobs.Connect(t)
	r := c.NewServedRunner(t, "e2e-down", localcluster.Config{ReadyTimeout: "3m"})
	r.StageServer.Kill(t) // leaves its socket behind, as a crash does: nobody listens on it
	gitlab := fakegitlab.New()
	defer gitlab.Close()
	job := gitlab.NewJob(fakegitlab.JobSpec{Image: ciImage, GitStrategy: "none", Script: []string{"echo hello from $(uname -r)"}})
	def := r.Definition()
	if def.PrepareExec != r.StageLauncher() || def.RunExec != r.StageLauncher() || def.CleanupExec != r.StageLauncher() {
		t.Fatalf("prepare_exec %s, run_exec %s, cleanup_exec %s: want the stage launcher", def.PrepareExec, def.RunExec, def.CleanupExec)
	}
	gitlab.Enqueue(job)
	proc := startRunner(t, gitlab, def)
	res := waitJob(t, gitlab, proc, job.ID)
	if res.State != fakegitlab.StateSuccess {
		t.Fatalf("job %d with its stage server down: %s (%s)", job.ID, res.State, res.FailureReason)
	}
	// cleanup runs after the trace is final: its warning is in the runner's own log, whole once
	// the runner has exited (one job and it stops).
	ctx, cancel := context.WithTimeout(context.Background(), realRunnerTimeout)
	defer cancel()
	if _, err := proc.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	r.WaitJobGone(t, job.ID)
	mustContain(t, "trace", res.Trace, "hello from 4.", "Sandbox ready: pool duo-default",
		"no stage server listening on "+r.StageServer.Socket+": prepare runs in its own process")
	mustContain(t, "runner log", proc.Log(), "no stage server listening on "+r.StageServer.Socket+": cleanup runs in its own process")
	if n := strings.Count(res.Trace, "runs in its own process"); n != 1 {
		t.Errorf("%d fallback warnings for prepare, want one:\n%s", n, res.Trace)
	}
}

// A stage server killed in the middle of prepare (SIGKILL, as a crash or the OOM killer would)
// fails that prepare as a system failure, which the runner retries, never as success; the retry,
// through a server started again on the same socket, gets the job its sandbox.
func TestStageServerKilledMidPrepare(t *testing.T) {
	t.Parallel()
	c := clusterjobs.Connect(t)
	const pool = "e2e-served-drained"
	benchPool(t, c, pool, 0) // drained: with drained_pool = "wait" prepare waits in the server
	r := c.NewServedRunner(t, "e2e-killed", localcluster.Config{ReadyTimeout: "3m", Extra: `drained_pool = "wait"`, Pools: localcluster.Pools(pool)})
	j := newJob(t, r, ciImage)
	j.MustStage(t, 0, "config")

	prepare := j.Command("prepare")
	stderr, err := prepare.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := prepare.Start(); err != nil {
		t.Fatal(err)
	}
	// The server is waiting for the pool on this prepare's behalf once its line reaches here.
	lines := bufio.NewReader(stderr)
	var seen strings.Builder
	for !strings.Contains(seen.String(), "is drained (0 of 0 ready): waiting for a warm sandbox") {
		line, err := lines.ReadString('\n')
		seen.WriteString(line)
		if err != nil {
			t.Fatalf("prepare ended before it waited for the pool: %v\n%s", err, seen.String())
		}
	}
	r.StageServer.Kill(t)
	rest, _ := io.ReadAll(lines)
	seen.Write(rest)
	err = prepare.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != clusterjobs.SystemFailure {
		t.Fatalf("prepare after its stage server was killed: %v, want exit %d (system failure)\n%s", err, clusterjobs.SystemFailure, seen.String())
	}
	mustContain(t, "prepare's output", seen.String(), "the stage server closed the connection before the stage ended")
	if _, err := c.Admin.Extensions.ExtensionsV1beta1().SandboxClaims(namespace).Get(context.Background(), j.ClaimName(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("claim %s after the killed prepare: %v, want none (prepare was still waiting for the pool)", j.ClaimName(), err)
	}

	// The runner's retry, once the server is back (on the socket the dead one left) and the
	// pool has a sandbox.
	r.StageServer = clusterjobs.StartStageServer(t, r.Binary(), r.ConfigPath, r.StageServer.Socket)
	pools := c.Admin.Extensions.ExtensionsV1beta1().SandboxWarmPools(namespace)
	p, err := pools.Get(context.Background(), pool, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Spec.Replicas = ptr.To[int32](1)
	if _, err := pools.Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPoolFull(t, c, pool)
	res := j.Prepare(t)
	mustContain(t, "retried prepare", res.Output(), "Sandbox ready: pool "+pool)
	mustContain(t, "stage server log", r.StageServer.Log.String(), "prepare exited 0")
	j.Cleanup(t)
}

// A stage launcher killed mid-run (SIGKILL: the runner's force kill after graceful_kill_timeout,
// or the runner lost) drops its connection, and the stage server stops the stage's processes in
// the pod as on a cancel, where a killed run process in its own process leaves them running until
// cleanup deletes the pod. Checked from outside the pod.
func TestLauncherKilledMidRun(t *testing.T) {
	t.Parallel()
	c := clusterjobs.Connect(t)
	r := c.NewServedRunner(t, "e2e-launcher-killed", localcluster.Config{ReadyTimeout: "3m"})
	j, pod, _ := preparedJob(t, r, ciImage)
	run := j.Command("run", j.Script(t, "sleep 600 &\necho stage-started\nwait\n"), "build_script")
	if run.Path != r.StageLauncher() {
		t.Fatalf("run starts %s, want the stage launcher", run.Path)
	}
	live := clusterjobs.NewLive()
	run.Stdout, run.Stderr = live, live
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	if !live.Wait("stage-started", 2*time.Minute) {
		_ = run.Process.Kill()
		t.Fatalf("the stage did not start:\n%s", live.String())
	}
	ps := func() string {
		out, _ := r.Exec(context.Background(), pod, "sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
		return out
	}
	if !strings.Contains(ps(), "sleep 600") {
		t.Fatalf("the stage's sleep is not running in pod %s: %q", pod, ps())
	}
	if err := run.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = run.Wait()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(r.StageServer.Log.String(), "run exited") {
		if time.Now().After(deadline) {
			t.Fatalf("the stage server did not end the stage of the killed launcher:\n%s", r.StageServer.Log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if out := ps(); strings.Contains(out, "sleep 600") {
		t.Errorf("the stage's processes survive its killed launcher in pod %s: %q", pod, out)
	}
	j.Cleanup(t)
}
