package executor

import "bytes"

// maxKeptText bounds what is kept of an agent's text that only ever becomes one error line (a
// refusal, a failed kill): the agent's side of the pod is the job's, and it may send gigabytes.
const maxKeptText = 4 << 10

// headBuffer keeps the first limit bytes written to it and drops the rest, reporting every write
// as whole so that a copy into it never stops early.
type headBuffer struct {
	buf   bytes.Buffer
	limit int
}

func newHeadBuffer(limit int) *headBuffer { return &headBuffer{limit: limit} }

func (h *headBuffer) Write(p []byte) (int, error) {
	if room := h.limit - h.buf.Len(); room > 0 {
		h.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// String is what was kept, trimmed of surrounding space.
func (h *headBuffer) String() string { return string(bytes.TrimSpace(h.buf.Bytes())) }
