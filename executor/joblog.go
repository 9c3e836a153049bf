package executor

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// JobLog writes the executor's own lines into the job log (the runner shows a stage's output in
// the job's trace). It never prints job variables or scripts: it is only ever given our own words.
type JobLog struct {
	W     io.Writer
	Debug bool
	// Now is the clock, replaced in tests.
	Now func() time.Time
}

const (
	ansiReset  = "\x1b[0;m"
	ansiBold   = "\x1b[1m"
	ansiGreen  = "\x1b[32;1m"
	ansiYellow = "\x1b[0;33m"
	ansiClear  = "\x1b[0K"
)

func (l *JobLog) printf(color, format string, args ...any) {
	if l == nil || l.W == nil {
		return
	}
	fmt.Fprintf(l.W, "%s%s%s\n", color, oneLine(fmt.Sprintf(format, args...)), ansiReset)
}

// Infof prints a line users see at the default verbosity: keep these few.
func (l *JobLog) Infof(format string, args ...any) { l.printf(ansiGreen, format, args...) }

// Warnf prints a problem the job survived.
func (l *JobLog) Warnf(format string, args ...any) { l.printf(ansiYellow, "WARNING: "+format, args...) }

// Debugf prints only with debug = true.
func (l *JobLog) Debugf(format string, args ...any) {
	if l != nil && l.Debug {
		l.printf("", "[debug] "+format, args...)
	}
}

func (l *JobLog) now() time.Time {
	if l.Now != nil {
		return l.Now()
	}
	return time.Now()
}

// Section opens a collapsible section of the job log (GitLab's section markers); the returned
// function closes it.
func (l *JobLog) Section(name, header string) func() {
	if l == nil || l.W == nil {
		return func() {}
	}
	id := sectionName(name)
	fmt.Fprintf(l.W, "section_start:%d:%s[collapsed=true]\r%s%s%s%s\n", l.now().Unix(), id, ansiClear, ansiBold, header, ansiReset)
	return func() { fmt.Fprintf(l.W, "section_end:%d:%s\r%s\n", l.now().Unix(), id, ansiClear) }
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
