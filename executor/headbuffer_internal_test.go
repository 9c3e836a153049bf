package executor

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// An agent's text becomes part of one short error line: a short refusal as it is, anything long
// or not a line its head quoted, with its size.
func TestHeadBufferLine(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"a refusal", "this sandbox belongs to another job\n", "this sandbox belongs to another job"},
		{"several lines", "first\nsecond\n", `"first\nsecond"... (13 bytes)`},
		{"a control character", "bell\a", `"bell\a"... (5 bytes)`},
		{"a flood", strings.Repeat("x", 1<<20), `"` + strings.Repeat("x", maxLineText) + `"... (1048576 bytes)`},
		{"cut in a character", strings.Repeat("x", maxLineText-1) + "é and more", `"` + strings.Repeat("x", maxLineText-1) + `"... (210 bytes)`},
	} {
		h := newHeadBuffer(maxKeptText)
		for chunk := range slicesOf(tc.in, 64<<10) {
			h.Write([]byte(chunk))
		}
		got := h.Line()
		if got != tc.want {
			t.Errorf("%s: Line() = %.300q, want %.300q", tc.name, got, tc.want)
		}
		if strings.Contains(got, "\n") || !utf8.ValidString(got) || len(got) > maxLineText+40 {
			t.Errorf("%s: Line() = %.300q is not one short line", tc.name, got)
		}
	}
}

func slicesOf(s string, n int) func(func(string) bool) {
	return func(yield func(string) bool) {
		for len(s) > 0 {
			k := min(n, len(s))
			if !yield(s[:k]) {
				return
			}
			s = s[k:]
		}
	}
}
