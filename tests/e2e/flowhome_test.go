//go:build e2e

package e2e

import (
	"strconv"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/tools/duoflow"
)

// TestFlowHomeIsWritable proves, through gitlab-runner 17.9, that $HOME is writable in the job
// pods of both of GitLab's flow images, as the duo CLI needs from 9.29.0 on (it writes its
// ripgrep into $HOME at start; GitLab's image v0.0.22 shipped it and was reverted because
// GitLab's own sandbox mounted $HOME read-only). In each pool, a flow job (duoflow.HomeJob) runs
// the duo CLI stand-in: with $HOME pointed at a directory nobody can write it fails in its one
// line (the control: the stand-in does check), and with the pod's own $HOME, as the image's
// user, it writes its ripgrep there, holds its session with the workflow service, whose agent
// finds $HOME writable too, and leaves the file behind, owned by that user.
func TestFlowHomeIsWritable(t *testing.T) {
	t.Parallel()
	inst, c, base := newFlowRunner(t, bothFlowPools()...)
	for _, tc := range []struct {
		name, image, pool, user, uid, home, rg string
	}{
		{"default image", flowImage, flowPool, "root", "0", "/root", "ripgrep from /usr/bin/rg"},
		{"hardened image", hardenedImage, hardenedPool, "duo-runner", "1001", "/home/duo-runner", "a placeholder: no rg on PATH"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job := inst.HomeJob(base, tc.image)
			session := strconv.FormatInt(job.ID, 10)
			res := runDuoJob(t, c, inst, job)
			rg := tc.home + "/" + duoflow.RipgrepInHome
			mustContainInOrder(t, res.Trace,
				"Sandbox ready: pool "+tc.pool,
				"home: "+tc.home+", user "+tc.user+" (uid "+tc.uid+")",
				"HOME="+duoflow.UnwritableHome+": duo: $HOME ("+duoflow.UnwritableHome+") is not writable: ",
				"the duo CLI writes its ripgrep into $HOME at start (as 9.29.0 does), so the job's user must be able to write to $HOME",
				"duo: $HOME is writable: wrote "+rg+" ("+tc.rg+")",
				"duo: session "+session+": connected (websocket)",
				"agent: HOME="+tc.home+" writable",
				"duo: session "+session+": finished",
				"after the flow: "+rg+", uid "+tc.uid+", mode 755",
			)
			if sessions := inst.Workflows.Sessions(session); len(sessions) != 1 || !sessions[0].Finished || len(sessions[0].Replies) != len(duoflow.HomeActions) {
				t.Errorf("workflow service sessions: %+v (refused %d)", sessions, inst.Workflows.Refused())
			}
			c.WaitJobGone(t, job.ID)
			t.Logf("job %d in pool %s: %s as %s; %s", job.ID, tc.pool, tc.home, tc.user, res.State)
		})
	}
}
