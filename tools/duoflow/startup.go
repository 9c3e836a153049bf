package duoflow

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
)

// TimestampsVariable turns on the runner's per-line timestamps (GitLab Runner's FF_TIMESTAMPS
// feature flag, 17.0 and later): every line of the job log starts with the time the runner
// received it, which is what StartupPhases splits a flow's start-up by.
var TimestampsVariable = fakegitlab.Variable{Key: "FF_TIMESTAMPS", Value: "true", Public: true}

// Phase is one part of a flow job's start-up and how long it took.
type Phase struct {
	Name string
	Took time.Duration
}

// startupMark is the first job log line holding all of its parts: it ends phase.
type startupMark struct {
	phase string
	parts []string
}

// startupMarks end the phases of the stock flow's start-up, in the order the runner and the
// job's script (StockScript) write them; the last phase ends at the workflow session.
var startupMarks = []startupMark{
	{"runner start", []string{"section_start:", ":prepare_executor"}},
	{"prepare (claim, helper)", []string{"section_start:", ":prepare_script"}},
	{"prepare_script stage", []string{"section_start:", ":get_sources"}},
	{"clone", []string{"section_start:", ":restore_cache"}},
	{"cache restore", []string{"section_start:", ":step_script"}},
	{"setup_script", []string{"$ command -v duo"}},
	{"duo CLI install", []string{"$ which duo"}},
}

// CLIStartPhase names the last phase: from `which duo` to the duo CLI's WebSocket session.
const CLIStartPhase = "duo CLI start (to its session)"

// timestampedLine is a line of a job log written with FF_TIMESTAMPS: the time, the stream (two
// hex digits, O or E, + for the rest of a line cut short), and the text.
var timestampedLine = regexp.MustCompile(`^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z) [0-9a-f]{2}[OE]\+? ?(.*)$`)

// StartupPhases splits a stock flow job's start-up, from its hand-out to its workflow session,
// by the timestamps of its job log (written with TimestampsVariable): the runner's start, our
// prepare, the runner's prepare_script, the clone, the cache restore, the setup_script, the duo
// CLI's install (a skip in an image that has it) and the CLI's start. An error names the first
// mark the log lacks.
func StartupPhases(trace string, handedOut, session time.Time) ([]Phase, error) {
	phases := make([]Phase, 0, len(startupMarks)+1)
	last, next := handedOut, 0
	for _, line := range strings.Split(trace, "\n") {
		if next == len(startupMarks) {
			break
		}
		m := timestampedLine.FindStringSubmatch(line)
		if m == nil || !containsAll(m[2], startupMarks[next].parts) {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			return nil, fmt.Errorf("job log line %q: %v", m[1], err)
		}
		phases = append(phases, Phase{startupMarks[next].phase, at.Sub(last)})
		last = at
		next++
	}
	if next < len(startupMarks) {
		return nil, fmt.Errorf("the job log has no timestamped line with %q (FF_TIMESTAMPS on?)", strings.Join(startupMarks[next].parts, " "))
	}
	return append(phases, Phase{CLIStartPhase, session.Sub(last)}), nil
}

func containsAll(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}
