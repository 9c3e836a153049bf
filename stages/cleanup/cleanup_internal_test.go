package cleanup

import (
	"testing"

	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/fakecluster"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

func TestMain(m *testing.M) { fakecluster.VerifyNoLeaks(m) }

// The outcome cleanup records: the stages' first deciding failure, success without one; a
// runner that gives TMPDIR but left no state saw prepare fail; without TMPDIR it is unknown and
// nothing is recorded.
func TestJobOutcome(t *testing.T) {
	failed := &executor.JobState{}
	failed.RecordFailure("step_script", failure.SystemError(nil, "pod gone"))
	for _, tc := range []struct {
		name   string
		state  *executor.JobState
		tmpDir string
		want   kube.Outcome
	}{
		{"stages succeeded", &executor.JobState{}, "/tmp/job", kube.Outcome{Result: kube.OutcomeSuccess}},
		{"a stage failed", failed, "/tmp/job", kube.Outcome{Result: kube.OutcomeFailed, Reason: kube.ReasonSystem}},
		{"prepare left no state", nil, "/tmp/job", kube.Outcome{Result: kube.OutcomeFailed, Reason: kube.ReasonPrepare}},
		{"no TMPDIR", nil, "", kube.Outcome{}},
	} {
		if got := jobOutcome(tc.state, tc.tmpDir); got != tc.want {
			t.Errorf("%s: outcome %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
