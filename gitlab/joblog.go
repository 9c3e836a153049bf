package gitlab

import (
	"fmt"
	"io"
	"strings"
	"time"

	"k8s.io/utils/clock"

	"github.com/sandbox-executor/sandbox-executor/failure"
)

// JobLog writes the executor's own lines into the job log (the runner shows a stage's output in
// the job's trace). It never prints job variables or scripts: it is only ever given our own words.
type JobLog struct {
	w     io.Writer
	debug bool
	// clock dates section markers and times steps.
	clock clock.PassiveClock
}

// NewJobLog writes to w (nil for nowhere), debug lines too if debug, dated by clk.
func NewJobLog(w io.Writer, debug bool, clk clock.PassiveClock) *JobLog {
	return &JobLog{w: w, debug: debug, clock: clk}
}

const (
	ansiReset  = "\x1b[0;m"
	ansiBold   = "\x1b[1m"
	ansiGreen  = "\x1b[32;1m"
	ansiYellow = "\x1b[0;33m"
	ansiRed    = "\x1b[31;1m"
	ansiClear  = "\x1b[0K"
)

func (l *JobLog) printf(color, format string, args ...any) {
	if l == nil || l.w == nil {
		return
	}
	fmt.Fprintf(l.w, "%s%s%s\n", color, failure.OneLine(fmt.Sprintf(format, args...)), ansiReset)
}

// Infof prints a line users see at the default verbosity: keep these few.
func (l *JobLog) Infof(format string, args ...any) { l.printf(ansiGreen, format, args...) }

// Warnf prints a problem the job survived.
func (l *JobLog) Warnf(format string, args ...any) { l.printf(ansiYellow, "WARNING: "+format, args...) }

// Errorf prints why the job failed, when the executor knows more than the job's own output says.
func (l *JobLog) Errorf(format string, args ...any) { l.printf(ansiRed, "ERROR: "+format, args...) }

// Debugf prints only with debug = true.
func (l *JobLog) Debugf(format string, args ...any) {
	if l != nil && l.debug {
		l.printf("", "[debug] "+format, args...)
	}
}

// Now is the time by the log's clock.
func (l *JobLog) Now() time.Time { return l.clock.Now() }

// Section opens a collapsible section of the job log (GitLab's section markers); the returned
// function closes it.
func (l *JobLog) Section(name, header string) func() {
	if l == nil || l.w == nil {
		return func() {}
	}
	id := sectionName(name)
	fmt.Fprintf(l.w, "section_start:%d:%s[collapsed=true]\r%s%s%s%s\n", l.Now().Unix(), id, ansiClear, ansiBold, header, ansiReset)
	return func() { fmt.Fprintf(l.w, "section_end:%d:%s\r%s\n", l.Now().Unix(), id, ansiClear) }
}

func sectionName(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '-' {
			return r
		}
		return '_'
	}, s)
}

// Millis formats a duration for the job log.
func Millis(d time.Duration) string { return fmt.Sprintf("%d ms", d.Milliseconds()) }

// FinalStage reports whether stage is the last one the runner runs for a job, after which the
// job log gets the summary: cleanup_file_variables on runners that write JOB_RESPONSE_FILE (13+),
// the artifacts upload on older ones, which always run it and know no later stage.
func FinalStage(stage string, modernRunner bool) bool {
	if modernRunner {
		return stage == "cleanup_file_variables"
	}
	return stage == "upload_artifacts_on_success" || stage == "upload_artifacts_on_failure"
}
