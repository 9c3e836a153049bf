package duoflow

import (
	"strconv"

	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakedws"
	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
)

// RipgrepInHome is where the duo CLI stand-in (tests/duocli) writes its ripgrep under $HOME when
// `duo run` starts, as duo CLI 9.29.0 writes its own: GitLab's image v0.0.22 shipped that CLI and
// was reverted, because GitLab's sandbox mounted $HOME read-only.
const RipgrepInHome = ".duo/bin/rg"

// UnwritableHome is a $HOME no user can write to, for the stand-in to refuse.
const UnwritableHome = "/proc"

// HomeScript is the script of HomeJob: who the job runs as and its $HOME; `duo run` with
// UnwritableHome as $HOME, which must fail in the stand-in's one line (the control: the check
// would catch a read-only $HOME); then `duo run` as the flow runs it, which writes its ripgrep
// into $HOME before its session; then the file it left, and its owner.
var HomeScript = []string{
	`echo "home: $HOME, user $(id -un) (uid $(id -u))"`,
	`if HOME=` + UnwritableHome + ` duo run --existing-session-id "$CI_JOB_ID" --connection-type websocket 2>/tmp/duo-home.err; then echo "HOME=` + UnwritableHome + `: duo ran"; else echo "HOME=` + UnwritableHome + `: $(cat /tmp/duo-home.err)"; fi`,
	`duo run --existing-session-id "$CI_JOB_ID" --connection-type websocket`,
	`stat -c "after the flow: %n, uid %u, mode %a" "$HOME/` + RipgrepInHome + `"`,
}

// HomeActions are what the workflow service has the agent do in HomeJob: say whether the
// agent's own $HOME is writable, from the agent's process.
var HomeActions = []fakedws.Action{
	{"action": "run_command", "command": `if test -w "$HOME"; then echo "agent: HOME=$HOME writable"; else echo "agent: HOME=$HOME NOT writable"; fi`},
}

// HomeJob is a flow job for commit sha in image that runs the duo CLI stand-in with the pod's
// $HOME (HomeScript); the instance's workflow service expects its session (HomeActions).
func (inst *Instance) HomeJob(sha, image string) fakegitlab.Job {
	job := inst.Job(sha, image)
	job.Steps[0].Script = HomeScript
	job.Artifacts = nil
	job.Cache = nil
	token, _ := job.Variable("GITLAB_OAUTH_TOKEN")
	inst.Workflows.Expect(strconv.FormatInt(job.ID, 10), token, HomeActions...)
	return job
}
