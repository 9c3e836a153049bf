//go:build security

package security

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/tests/clustertest"
	"github.com/sandbox-executor/sandbox-executor/tests/localcluster"
)

// TestFenceFailsClosedWhileThePolicyControllerRestarts restarts the NetworkPolicy controller
// (kube-router: its start flushes its rules, and pods are unfenced until its first sync) while
// jobs start back to back, each trying "the internet" first thing. No job may reach it: a warm
// pod whose fence does not hold is not Ready (the agent's readiness probe), and prepare's own
// check refuses a pod whose fence lapsed after its last probe. Jobs may wait or fail as system
// failures meanwhile; after the restart they must run again.
//
// It needs deploy/local's templates with the fence check (SANDBOX_EXECUTOR_FENCE_* and the
// readinessProbe): make cluster-up applies them.
func TestFenceFailsClosedWhileThePolicyControllerRestarts(t *testing.T) {
	c := clustertest.Connect(t)
	requireFenceInTemplate(t, c)
	r := c.NewRunner(t, "sec-fence", "require_fence = true")

	// The break: down removes kube-router's rules and the outside world, up brings the outside
	// world back first and then starts kube-router, whose rules take a while: the window.
	restoreAfterBreak(t)
	if out, err := clustertest.ClusterScript(t.Context(), "networkpolicy.sh", "down"); err != nil {
		t.Fatalf("networkpolicy.sh down: %v\n%s", err, out)
	}
	restarted := make(chan struct{})
	go func() {
		defer close(restarted)
		if out, err := clustertest.ClusterScript(context.Background(), "networkpolicy.sh", "up"); err != nil {
			t.Errorf("networkpolicy.sh up: %v\n%s", err, out)
		}
	}()

	var ran, refused atomic.Int32
	var afterRestart atomic.Bool
	deadline := make(chan struct{})
	go func() {
		<-restarted
		afterRestart.Store(true)
		time.Sleep(30 * time.Second) // jobs keep starting while the rules settle
		close(deadline)
	}()
	var wg sync.WaitGroup
	for range 2 { // the node has 2 CPUs: two jobs at a time keep it busy without starving it
		wg.Go(func() {
			for {
				select {
				case <-deadline:
					return
				default:
				}
				switch fenceJob(t, r) {
				case jobRan:
					ran.Add(1)
				case jobRefused:
					refused.Add(1)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d jobs ran, %d were refused a pod (the fence did not hold, or no pod became Ready)", ran.Load(), refused.Load())
	if ran.Load() == 0 {
		t.Error("no job ran once the controller was back: the test proved nothing")
	}
}

type jobOutcome int

const (
	jobRan jobOutcome = iota
	jobRefused
)

// fenceJob runs one job whose first command tries "the internet"; reaching it fails the test.
// It runs on a goroutine of its own, so it reports with Errorf, never Fatalf.
func fenceJob(t *testing.T, r *clustertest.Runner) jobOutcome {
	j := r.NewJob(t, clustertest.JobSpec{})
	defer j.Cleanup(t)
	if res := j.Stage(t, "config"); res.ExitCode != 0 {
		t.Errorf("job %d: config exited %d\n%s", j.ID, res.ExitCode, res.Output())
		return jobRefused
	}
	prep := j.Stage(t, "prepare")
	if prep.ExitCode != 0 {
		if prep.ExitCode != clustertest.SystemFailure {
			t.Errorf("job %d: prepare exited %d, want success or a system failure\n%s", j.ID, prep.ExitCode, prep.Output())
		}
		return jobRefused
	}
	res := j.Run(t, "curl -sS --connect-timeout 2 --max-time 3 http://"+internet+"/ ; echo rc=$?\n")
	if strings.Contains(res.Output(), "outside") {
		t.Errorf("job %d reached the internet (%s) from a pod it was handed:\n%s", j.ID, internet, res.Output())
	}
	return jobRan
}

// requireFenceInTemplate fails the test unless the default pool's template configures the fence
// check: without it, this test would only show that nothing stops the jobs.
func requireFenceInTemplate(t *testing.T, c *clustertest.Cluster) {
	t.Helper()
	tmpl, err := c.Admin.Extensions.ExtensionsV1beta1().SandboxTemplates(clustertest.Namespace).Get(t.Context(), localcluster.Template, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	job := tmpl.Spec.PodTemplate.Spec.Containers[0]
	for _, e := range job.Env {
		if e.Name == wire.FenceDenyEnv && job.ReadinessProbe != nil {
			return
		}
	}
	t.Fatalf("SandboxTemplate %s has no fence check (%s, readinessProbe): apply this branch's deploy/local (make cluster-up)", tmpl.Name, wire.FenceDenyEnv)
}

// restoreAfterBreak brings the NetworkPolicy controller back whatever happens to the test, and
// proves enforcement before the next test runs. It is clustertest.RestoreAfterBreak's approach
// (tests/cluster/netpol-check.sh after an idempotent start), for a branch without it.
func restoreAfterBreak(t *testing.T) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if out, err := clustertest.ClusterScript(ctx, "networkpolicy.sh", "up"); err != nil {
			t.Errorf("restoring NetworkPolicy enforcement: %v\n%s", err, out)
			return
		}
		// netpol-check.sh polls each policy change for NETPOL_CHECK_WAIT seconds (its default
		// is enough here: kube-router has synced once "up" returns).
		if out, err := clustertest.ClusterScript(ctx, "netpol-check.sh"); err != nil {
			t.Errorf("NetworkPolicy is not enforced after the restart (tests/cluster/netpol-check.sh): %v\n%s", err, out)
		}
	})
}
