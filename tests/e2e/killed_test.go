//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
)

// TestAgentKilledMidStage kills the stage daemon in the job's pod (SIGKILL, from an exec with
// admin rights) while a stage runs over the network transport: the job container ends with it,
// and run reports a system failure that names the pod, never a success with the output cut. On
// both run paths.
func TestAgentKilledMidStage(t *testing.T) {
	t.Parallel()
	onEachRunPath(t, testAgentKilledMidStage)
}

func testAgentKilledMidStage(t *testing.T, path runPath) {
	c := newClusterOn(t, path, `stage_transport = "network"`)
	j, pod, prep := preparedJob(t, c, ciImage)
	mustContain(t, "prepare log", prep, "stages over pod network")
	run := j.Command("run", j.Script(t, "echo stage-started\nsleep 300\necho must-not-be-reached\n"), "build_script")
	live := clusterjobs.NewLive()
	run.Stdout, run.Stderr = live, live
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	defer run.Process.Kill() // a no-op once run has exited
	if !live.Wait("stage-started", 2*time.Minute) {
		t.Fatalf("the stage did not start:\n%s", live.String())
	}
	pidFile := wire.BaseDir + "/daemon.pid"
	if out, err := c.Exec(context.Background(), pod, "sh", "-c", "kill -9 $(cat "+pidFile+")"); err != nil {
		t.Fatalf("killing the agent's daemon in pod %s: %v %s", pod, err, out)
	}
	err := run.Wait()
	if code := clusterjobs.ExitCode(err); code != clusterjobs.SystemFailure {
		t.Fatalf("exit %d after the agent was killed, want SYSTEM_FAILURE (%d):\n%s", code, clusterjobs.SystemFailure, live.String())
	}
	if strings.Contains(live.String(), "must-not-be-reached") {
		t.Errorf("the stage went on after its agent was killed:\n%s", live.String())
	}
	mustContain(t, "job log", live.String(), pod)
	lines := strings.Split(strings.TrimSpace(live.String()), "\n")
	t.Logf("run ended with: %s", lines[len(lines)-1])
}

// TestKilledRunnerLeavesNothingBehind SIGKILLs two runners (and with them their executor
// processes, as a lost node would) while their jobs run. Each claim carries a shutdownTime of
// the job's timeout plus claim_grace from prepare; `gc --delete --older-than` reaps the first at
// once, and agent-sandbox deletes the second at its shutdownTime, with its sandbox and pod. The
// test says how late after its shutdownTime the second went.
func TestKilledRunnerLeavesNothingBehind(t *testing.T) {
	t.Parallel()
	// The watch must begin before prepare + timeout + grace; beside concurrent tests prepare may cold-start.
	const timeout, grace = 90 * time.Second, 5 * time.Second
	gitlab := fakegitlab.New()
	defer gitlab.Close()
	type killed struct {
		r     *clusterjobs.Runner
		id    int64
		claim string
	}
	var jobs []killed
	c := clusterjobs.Connect(t)
	for _, name := range []string{"e2e-gc-reaped", "e2e-expired"} {
		// A runner name of its own: gc reaps by runner name. The second runs its stages through
		// a stage server (which outlives the runner, as a server beside a killed runner may): the
		// claim is left to the same nets either way.
		cfg := localcluster.Config{Extra: fmt.Sprintf("claim_grace = %q", grace.String())}
		var r *clusterjobs.Runner
		if name == "e2e-expired" {
			r = c.NewServedRunner(t, name, cfg)
		} else {
			r = c.NewRunnerWith(t, name, cfg)
		}
		id := fakegitlab.NextJobID()
		job := gitlab.NewJob(fakegitlab.JobSpec{ID: id, Image: ciImage, GitStrategy: "none", Timeout: timeout,
			Script: []string{"echo build-started", "while :; do echo tick; sleep 1; done"}})
		gitlab.Enqueue(job)
		proc := startRunner(t, gitlab, r.Definition())
		waitTrace(t, gitlab, proc, id, "build-started")
		claim := kube.ClaimName(job.Token, r.Name, id)
		got, err := r.Admin.Extensions.ExtensionsV1beta1().SandboxClaims(namespace).Get(context.Background(), claim, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: the claim of the running job: %v", name, err)
		}
		lc := got.Spec.Lifecycle
		if lc == nil || lc.ShutdownTime == nil || string(lc.ShutdownPolicy) != "Delete" {
			t.Fatalf("%s: claim %s has no shutdownTime with policy Delete: %+v", name, claim, lc)
		}
		// prepare sets it to now + timeout + grace, truncated to the second.
		if d := lc.ShutdownTime.Sub(got.CreationTimestamp.Time); d < timeout+grace-2*time.Second || d > timeout+grace+2*time.Second {
			t.Errorf("%s: shutdownTime is %s after the claim's creation, want the job timeout + claim_grace (%s)", name, d, timeout+grace)
		}
		if err := syscall.Kill(proc.PID(), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-proc.Exited() // the harness then kills the runner's process group: its executors
		jobs = append(jobs, killed{r, id, claim})
	}

	// agent-sandbox's own net: the second claim goes at its shutdownTime. Watched from now on,
	// so that its deletion is seen when it happens.
	second := jobs[1]
	if first := jobs[0]; first.r.Name == second.r.Name {
		t.Fatalf("both runners are named %s: gc would reap both", first.r.Name)
	}
	claims := second.r.Admin.Extensions.ExtensionsV1beta1().SandboxClaims(namespace)
	ctx, cancel := context.WithTimeout(context.Background(), timeout+grace+2*time.Minute)
	defer cancel()
	w, err := claims.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", second.claim).String()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	got, err := claims.Get(ctx, second.claim, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the second claim is gone before the test could watch it: %v", err)
	}
	shutdown := got.Spec.Lifecycle.ShutdownTime.Time
	if time.Now().After(shutdown) {
		t.Fatalf("the test reached the second claim after its shutdownTime: nothing to measure")
	}

	// The operator's net, meanwhile: gc reaps the first runner's claim now, well before its
	// shutdownTime.
	first := jobs[0]
	reaped := make(chan struct{})
	go func() {
		defer close(reaped)
		out, err := exec.Command(first.r.Binary(), "--config", first.r.ConfigPath, "gc", "--delete", "--older-than", "1s").CombinedOutput()
		if err != nil {
			t.Errorf("gc --delete: %v\n%s", err, out)
			return
		}
		mustContain(t, "gc output", string(out), first.claim)
		first.r.WaitJobGone(t, first.id)
	}()
	defer func() { <-reaped }()

	for ev := range w.ResultChan() {
		if ev.Type == watch.Deleted {
			t.Logf("claim %s deleted %s after its shutdownTime (job timeout %s + claim_grace %s)", second.claim, time.Since(shutdown).Round(10*time.Millisecond), timeout, grace)
			second.r.WaitJobGone(t, second.id)
			return
		}
	}
	t.Fatalf("claim %s was not deleted within 2m of its shutdownTime %s", second.claim, shutdown.Format(time.RFC3339))
}
