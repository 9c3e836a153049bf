package duoflow

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
)

// TimestampsVariable turns on the runner's per-line timestamps (GitLab Runner's FF_TIMESTAMPS
// feature flag, 17.0 and later): every line of the job log starts with a time, which is what
// StartupPhases splits a flow's start-up by.
var TimestampsVariable = fakegitlab.Variable{Key: "FF_TIMESTAMPS", Value: "true", Public: true}

// Phase is one part of a flow job's start-up and how long it took.
type Phase struct {
	Name string
	Took time.Duration
}

// Phase names; the executor's own parts of prepare are read from its job log lines.
const (
	PhasePrepare       = "hand-out to prepare's end"
	PhaseClaim         = "  claim (executor's figure)"
	PhaseHelper        = "  runner helper (executor's figure)"
	PhasePrepareScript = "prepare_script stage"
	PhaseClone         = "clone"
	PhaseCacheRestore  = "cache restore"
	PhaseScript        = "script to the CLI's session (setup_script, CLI install, SRT probe, CLI start)"
)

// startupSections end the phases, in the order the runner opens them: each phase ends where
// the runner opens the next stage's section. Only these lines' times are used: gitlab-runner
// 17.9 writes its section markers in order, while the times it puts on a stage's own lines
// were seen out of order by up to 0.7 s (a line stamped before the line above it).
var startupSections = []struct{ phase, section string }{
	{PhasePrepare, "prepare_script"},
	{PhasePrepareScript, "get_sources"},
	{PhaseClone, "restore_cache"},
	{PhaseCacheRestore, "step_script"},
}

// timestampedLine is a line of a job log written with FF_TIMESTAMPS: the time, the stream (two
// hex digits, O or E, + for the rest of a line cut short), and the text.
var timestampedLine = regexp.MustCompile(`^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z) [0-9a-f]{2}[OE]\+? ?(.*)$`)

// The executor's own figures for the claim and the runner helper (executor/helper.go).
var (
	claimedIn      = regexp.MustCompile(`claimed in (\d+) ms`)
	helperInstalls = regexp.MustCompile(`(?:Copied the runner helper|Runner helper: baked in the pod) .* in (\d+) ms`)
)

// StartupPhases splits a stock flow job's start-up, from its hand-out to its workflow session,
// by the times of the runner's stage sections in its job log (written with TimestampsVariable):
// up to prepare's end (the runner's start and our prepare, with the claim and the runner
// helper as the executor's log gives them), the runner's prepare_script, the clone, the cache
// restore, and the job script up to the duo CLI's session. An error names the first part the log
// lacks.
func StartupPhases(trace string, handedOut, session time.Time) ([]Phase, error) {
	var phases []Phase
	last, next := handedOut, 0
	for _, line := range strings.Split(trace, "\n") {
		if next == len(startupSections) {
			break
		}
		m := timestampedLine.FindStringSubmatch(line)
		if m == nil || !strings.Contains(m[2], "section_start:") || !strings.HasSuffix(strings.TrimRight(m[2], "\r"), ":"+startupSections[next].section) {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			return nil, fmt.Errorf("job log line %q: %v", m[1], err)
		}
		phases = append(phases, Phase{startupSections[next].phase, at.Sub(last)})
		last = at
		next++
	}
	if next < len(startupSections) {
		return nil, fmt.Errorf("the job log has no timestamped start of section %s (FF_TIMESTAMPS on?)", startupSections[next].section)
	}
	claim, err := millisOf(trace, claimedIn)
	if err != nil {
		return nil, err
	}
	helper, err := millisOf(trace, helperInstalls)
	if err != nil {
		return nil, err
	}
	// The executor's parts go under prepare, where they happened.
	phases = append(phases[:1], append([]Phase{{PhaseClaim, claim}, {PhaseHelper, helper}}, phases[1:]...)...)
	return append(phases, Phase{PhaseScript, session.Sub(last)}), nil
}

// millisOf is the first "N ms" figure re finds in trace.
func millisOf(trace string, re *regexp.Regexp) (time.Duration, error) {
	m := re.FindStringSubmatch(trace)
	if m == nil {
		return 0, fmt.Errorf("the job log has no line matching %q", re)
	}
	n, err := strconv.Atoi(m[1])
	if err != nil {
		return 0, fmt.Errorf("job log figure %q: %v", m[1], err)
	}
	return time.Duration(n) * time.Millisecond, nil
}
