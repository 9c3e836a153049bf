package executor

import (
	"fmt"
	"time"
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
}

// AddStage accounts one run_exec call that took wall in all, of which the script ran for script.
func (o *Overhead) AddStage(wall, script time.Duration) {
	o.Stages++
	o.StageTotal += max(wall-script, 0)
}

// Total is the executor's whole cost to the job so far.
func (o *Overhead) Total() time.Duration { return o.Prepare + o.StageTotal }

// Summary is the job log's closing line.
func (o *Overhead) Summary(sbx *Sandbox) string {
	origin, acquired := sbx.Origin()
	return fmt.Sprintf("Sandbox summary: %s, %s in %s; executor overhead %s (prepare %s, %d stages %s)",
		origin, acquired, Millis(o.Claim), Millis(o.Total()), Millis(o.Prepare), o.Stages, Millis(o.StageTotal))
}

// FinalStage reports whether stage is the last one the runner runs for a job, after which the
// job log gets the summary: cleanup_file_variables on runners that write JOB_RESPONSE_FILE (13+),
// the artifacts upload on older ones, which always run it and know no later stage.
func FinalStage(stage string, modernRunner bool) bool {
	if modernRunner {
		return stage == "cleanup_file_variables"
	}
	return stage == "upload_artifacts_on_success" || stage == "upload_artifacts_on_failure"
}
