package executor

import (
	"bytes"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// maxKeptText bounds what is kept of an agent's text that only ever becomes one error line (a
// refusal, a failed kill): the agent's side of the pod is the job's, and it may send gigabytes.
const maxKeptText = 4 << 10

// maxLineText is how much of that text an error line shows.
const maxLineText = 200

// headBuffer keeps the first limit bytes written to it and drops the rest, reporting every write
// as whole so that a copy into it never stops early. It counts everything written.
type headBuffer struct {
	buf   bytes.Buffer
	limit int
	total int64
}

func newHeadBuffer(limit int) *headBuffer { return &headBuffer{limit: limit} }

func (h *headBuffer) Write(p []byte) (int, error) {
	if room := h.limit - h.buf.Len(); room > 0 {
		h.buf.Write(p[:min(len(p), room)])
	}
	h.total += int64(len(p))
	return len(p), nil
}

// String is what was kept, trimmed of surrounding space.
func (h *headBuffer) String() string { return string(bytes.TrimSpace(h.buf.Bytes())) }

// Line is what was written as a short part of one error line: as it is when it is a short line
// of printable text (an agent's refusal, "this sandbox belongs to another job"), else its first
// maxLineText bytes quoted, and how many bytes were written in all. A flood, or text with line
// breaks or control characters, never makes the error line long or several lines.
func (h *headBuffer) Line() string {
	s := h.String()
	if len(s) <= maxLineText && h.total <= int64(h.limit) && printableLine(s) {
		return s
	}
	head := s
	if len(head) > maxLineText {
		head = head[:maxLineText]
		for i := 0; i < utf8.UTFMax && !utf8.ValidString(head); i++ {
			head = head[:len(head)-1] // not half a character: %q would show it as bytes
		}
	}
	return fmt.Sprintf("%q... (%d bytes)", head, h.total)
}

func printableLine(s string) bool {
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) && r != ' ' {
			return false
		}
	}
	return true
}
