package gitlab

import (
	"bytes"
	"fmt"
	"io"
)

// GitLab's flow script wraps the duo CLI in nono (Landlock) when an instance turns on the
// feature flag duo_workflow_nono_sandbox (ee/lib/gitlab/duo_workflow/sandbox.rb). It fails
// closed: without nono on PATH, or when nono's pre-check fails, it prints one of the lines
// below and exits 1. gVisor implements no Landlock (google/gvisor#13439), so in our pods the
// pre-check always fails, and the job log says only what nono saw.
var (
	// nonoScriptMarker is in the script only when GitLab wrapped the flow in nono.
	nonoScriptMarker = []byte(`nono_precheck_output="$(`)
	// The lines GitLab's script prints as it refuses to run the flow.
	nonoRefusals = []struct{ line, cause string }{
		{"Error: nono found but the sandbox pre-check failed", "nono's Landlock pre-check failed"},
		{"Error: nono not found on PATH", "the image has no nono"},
	}
)

// nonoWatchLine is how much of a line's start a NonoWatch keeps: more than GitLab's lines'
// prefixes it looks for.
const nonoWatchLine = 128

// WrapsNono tells whether a stage script runs the flow under GitLab's nono wrapper.
func WrapsNono(script []byte) bool { return bytes.Contains(script, nonoScriptMarker) }

// NonoWatch passes a stage's output through to W and notes whether GitLab's nono wrapper said
// it refused to run the flow. It looks only at the starts of lines and keeps at most a short
// partial line: it costs the stream nothing but a scan.
type NonoWatch struct {
	W       io.Writer
	line    []byte // the current line's start, up to nonoWatchLine bytes
	refused string // the cause, once a refusal was seen
}

// Write passes p through and scans it.
func (w *NonoWatch) Write(p []byte) (int, error) {
	for rest := p; len(rest) > 0; {
		i := bytes.IndexByte(rest, '\n')
		chunk := rest
		if i >= 0 {
			chunk = rest[:i]
		}
		w.line = append(w.line, chunk[:min(len(chunk), nonoWatchLine-len(w.line))]...)
		if i < 0 {
			break
		}
		w.endLine()
		rest = rest[i+1:]
	}
	return w.W.Write(p)
}

func (w *NonoWatch) endLine() {
	line := bytes.TrimRight(w.line, "\r")
	for _, r := range nonoRefusals {
		if w.refused == "" && bytes.HasPrefix(line, []byte(r.line)) {
			w.refused = r.cause
		}
	}
	w.line = w.line[:0]
}

// Refused is the cause GitLab's nono wrapper gave for refusing to run the flow, or "" if it
// said none.
func (w *NonoWatch) Refused() string { return w.refused }

// NonoRefusal is the job-log line that says why a flow GitLab wrapped in nono did not run in
// a pod of pool, what isolates the job instead and what the instance's admin can do
// (docs/agent-config.md, "nono").
func NonoRefusal(cause, runtimeClass, pool, fence string) string {
	return fmt.Sprintf("nono: GitLab's flow script refused to run the flow (%s): nono needs Landlock, which gVisor does not implement (google/gvisor#13439). "+
		"This job is isolated by gVisor (RuntimeClass %s) and fenced by %s of pool %s instead; "+
		"to run flows on these runners, keep the feature flag duo_workflow_nono_sandbox off on this instance (docs/agent-config.md#nono)",
		cause, runtimeClass, fence, pool)
}
