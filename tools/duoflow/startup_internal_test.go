package duoflow

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// stockTrace is the start of a stock flow's job log as gitlab-runner 17.9 writes it with
// FF_TIMESTAMPS (the line layout of a real run: section markers cut with "+", ANSI colours).
const stockTrace = "2026-11-29T04:09:40.100000Z 00O \x1b[0KRunning with gitlab-runner 17.9.0 (c4cbe9dd)\x1b[0;m\n" +
	"2026-11-29T04:09:40.150000Z 00O section_start:1795925380:prepare_executor\r\n" +
	"2026-11-29T04:09:40.150005Z 00O+\x1b[0K\x1b[0K\x1b[36;1mPreparing the \"custom\" executor\x1b[0;m\x1b[0;m\n" +
	"2026-11-29T04:09:40.392000Z 00E Copied the runner helper (/usr/bin/gitlab-runner-helper, 45.7 MB) into the pod as /tmp/.sandbox-executor/bin/gitlab-runner in 1304 ms\n" +
	"2026-11-29T04:09:40.400000Z 00O section_end:1795925380:prepare_executor\r\n" +
	"2026-11-29T04:09:40.400005Z 00O+\x1b[0Ksection_start:1795925380:prepare_script\r\n" +
	"2026-11-29T04:09:40.500000Z 00O section_end:1795925380:prepare_script\r\n" +
	"2026-11-29T04:09:40.500005Z 00O+\x1b[0Ksection_start:1795925380:get_sources\r\n" +
	"2026-11-29T04:09:40.512000Z 01E Cloning into '/builds/duo/project'...\n" +
	"2026-11-29T04:09:41.000000Z 00O section_end:1795925381:get_sources\r\n" +
	"2026-11-29T04:09:41.000005Z 00O+\x1b[0Ksection_start:1795925381:restore_cache\r\n" +
	"2026-11-29T04:09:41.200000Z 00O section_end:1795925381:restore_cache\r\n" +
	"2026-11-29T04:09:41.200005Z 00O+\x1b[0Ksection_start:1795925381:step_script\r\n" +
	"2026-11-29T04:09:41.300000Z 01O \x1b[32;1m$ mkdir -p /var/tmp/.gitlab-sandbox\x1b[0;m\n" +
	// A stage's lines may carry times out of order (seen with 17.9): they split nothing.
	"2026-11-29T04:09:40.900000Z 01O \x1b[32;1m$ command -v duo > /dev/null 2>&1 && echo \"duo-cli already present\"\x1b[0;m\n" +
	"2026-11-29T04:09:42.400000Z 01E Sandbox summary: pool duo-flow (warm start), claimed in 362 ms; executor overhead 2438 ms\n"

// TestStartupPhasesSplitTheHandOutToTheSession: each phase runs from the previous mark to its
// own, the first from the hand-out and the last to the workflow session.
func TestStartupPhasesSplitTheHandOutToTheSession(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, "2026-11-29T04:09:"+s+"Z")
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	phases, err := StartupPhases(stockTrace, at("40.000"), at("43.000"))
	if err != nil {
		t.Fatal(err)
	}
	want := []Phase{
		{PhasePrepare, 400*time.Millisecond + 5*time.Microsecond},
		{PhaseClaim, 362 * time.Millisecond},
		{PhaseHelper, 1304 * time.Millisecond},
		{PhasePrepareScript, 100 * time.Millisecond},
		{PhaseClone, 500 * time.Millisecond},
		{PhaseCacheRestore, 200 * time.Millisecond},
		{PhaseScript, 1800*time.Millisecond - 5*time.Microsecond},
	}
	if !reflect.DeepEqual(phases, want) {
		t.Errorf("phases:\n got %v\nwant %v", phases, want)
	}
}

// TestStartupPhasesNameTheMissingMark: a log without timestamps, or a job that never reached
// its script, is an error that says which line is missing, not a split with holes.
func TestStartupPhasesNameTheMissingMark(t *testing.T) {
	now := time.Now()
	for name, trace := range map[string]string{
		"no timestamps": "\x1b[0KRunning with gitlab-runner 17.9.0\nsection_start:1:prepare_executor\r\n",
		"no script":     stockTrace[:strings.Index(stockTrace, "2026-11-29T04:09:41.200005Z")],
	} {
		_, err := StartupPhases(trace, now, now)
		if err == nil {
			t.Errorf("%s: no error", name)
			continue
		}
		if name == "no script" && !strings.Contains(err.Error(), "section step_script") {
			t.Errorf("%s: %v does not name the step_script section", name, err)
		}
	}
}

// TestStartupPhasesNeedTheExecutorsFigures: a prepare whose log lacks the helper's line (a job
// with no cache) is an error, not a helper that took no time.
func TestStartupPhasesNeedTheExecutorsFigures(t *testing.T) {
	trace := strings.Replace(stockTrace, "Copied the runner helper", "Skipped the runner helper", 1)
	if _, err := StartupPhases(trace, time.Now(), time.Now()); err == nil || !strings.Contains(err.Error(), "runner helper") {
		t.Errorf("a log without the helper's line: %v", err)
	}
}

// FuzzStartupPhases: any job log either splits into every phase or is an error; never a panic.
func FuzzStartupPhases(f *testing.F) {
	f.Add(stockTrace)
	f.Add("2026-11-29T04:09:40Z 00O section_start:1:prepare_executor\r\n")
	f.Fuzz(func(t *testing.T, trace string) {
		phases, err := StartupPhases(trace, time.Time{}, time.Time{})
		if err == nil && len(phases) != len(startupSections)+3 {
			t.Fatalf("%d phases without an error", len(phases))
		}
	})
}
