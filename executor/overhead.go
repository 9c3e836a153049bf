package executor

import (
	"fmt"
	"time"

	"github.com/sandbox-executor/sandbox-executor/gitlab"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// Overhead is the time the executor itself adds to a job, beyond what the job's scripts run:
// prepare (claim, checks, agent handover) and each stage's own cost around its script. It
// travels with the job's state from stage to stage, and the job log closes with its summary.
type Overhead struct {
	Claim   time.Duration `json:"claim"`
	Prepare time.Duration `json:"prepare"`
	Stages  int           `json:"stages"`
	// StageTotal is the stages' own cost: each run_exec's wall time less its script's.
	StageTotal time.Duration `json:"stageTotal"`
	// ScriptTotal is what the stages' scripts ran for, as their agent timed them: the job's own
	// time, for telling it apart from the executor's and the runner's in the summary.
	ScriptTotal time.Duration `json:"scriptTotal,omitempty"`
}

// AddStage accounts one run_exec call that took wall in all, of which the script ran for script.
func (o *Overhead) AddStage(wall, script time.Duration) {
	o.Stages++
	o.StageTotal += max(wall-script, 0)
	o.ScriptTotal += min(script, wall)
}

// Total is the executor's whole cost to the job so far.
func (o *Overhead) Total() time.Duration { return o.Prepare + o.StageTotal }

// Summary is the job log's closing line.
func (o *Overhead) Summary(sbx *kube.Sandbox) string {
	origin, acquired := sbx.Origin()
	return fmt.Sprintf("Sandbox summary: %s, %s in %s; executor overhead %s (prepare %s, %d stages %s); scripts %s",
		origin, acquired, gitlab.Millis(o.Claim), gitlab.Millis(o.Total()), gitlab.Millis(o.Prepare), o.Stages, gitlab.Millis(o.StageTotal), gitlab.Millis(o.ScriptTotal))
}
