//go:build e2e

package e2e

import (
	"strings"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tools/duoflow"
)

// TestFlowUnderNonoSaysWhyItCannotRun runs GitLab's flow job as an instance with the feature
// flag duo_workflow_nono_sandbox on makes it (duoflow.NonoJob: `duo run` wrapped in nono, which
// fails closed) through gitlab-runner 17.9, in the pools of GitLab's two flow images:
//   - the default image, with a nono stand-in on PATH that asks the kernel for Landlock as nono
//     does first (duoflow.NonoStandIn): gVisor answers ENOSYS (the fault is the runtime's, and
//     the job log shows it), GitLab's pre-check fails and its script exits 1;
//   - the hardened image, without nono: GitLab's script exits 1 at once.
//
// Each job fails as a script failure, and the executor's one ERROR line after GitLab's says the
// cause, what isolates the job instead and what the admin can do.
func TestFlowUnderNonoSaysWhyItCannotRun(t *testing.T) {
	t.Parallel()
	inst, c, base := newFlowRunner(t, bothFlowPools()...)
	for _, tc := range []struct {
		name, image, pool string
		setup             []string
		cause             string
		gitlabSays        []string // GitLab's script's lines, in order
	}{
		{"nono without Landlock", flowImage, flowPool, duoflow.NonoStandIn, "nono's Landlock pre-check failed", []string{
			"nono found, testing Landlock sandbox capabilities...",
			"Error: nono found but the sandbox pre-check failed, refusing to run without a sandbox",
			"nono reported: nono stand-in: landlock_create_ruleset(LANDLOCK_CREATE_RULESET_VERSION): errno 38", // ENOSYS: gVisor has no Landlock
			"nono: Sandbox initialization failed: Landlock not available.",
		}},
		{"no nono in the image", hardenedImage, hardenedPool, nil, "the image has no nono", []string{
			"Error: nono not found on PATH (image must ship it), refusing to run without a sandbox",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job := inst.NonoJob(base, tc.image, tc.setup...)
			res, _ := runJobToItsEnd(t, c.Definition(), inst, job, nil)
			if res.State != fakegitlab.StateFailed || res.FailureReason != fakegitlab.FailureScript {
				t.Fatalf("job %d: %s (%s), want failed (%s):\n%s", job.ID, res.State, res.FailureReason, fakegitlab.FailureScript, res.Trace)
			}
			ours := "ERROR: nono: GitLab's flow script refused to run the flow (" + tc.cause + "): nono needs Landlock, which gVisor does not implement (google/gvisor#13439). " +
				"This job is isolated by gVisor (RuntimeClass gvisor) and fenced by its NetworkPolicy and the egress proxy of pool " + tc.pool + " instead; " +
				"to run flows on these runners, keep the feature flag duo_workflow_nono_sandbox off on this instance (docs/agent-config.md#nono)"
			mustContainInOrder(t, res.Trace, append(append([]string{"Sandbox ready: pool " + tc.pool}, tc.gitlabSays...), ours)...)
			if n := strings.Count(res.Trace, "nono: GitLab's flow script refused"); n != 1 {
				t.Errorf("the executor's line %d times, want once:\n%s", n, res.Trace)
			}
			if strings.Contains(res.Trace, "Command execution completed") || strings.Contains(res.Trace, "connected (websocket)") {
				t.Errorf("the flow ran:\n%s", res.Trace)
			}
			c.WaitJobGone(t, job.ID)
		})
	}
}
