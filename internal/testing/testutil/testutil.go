// Package testutil holds the small helpers that tests across the module share. It imports
// nothing but the standard library, so that any package's unit tests can use it without pulling
// in cluster code.
package testutil

import (
	"bytes"
	"strings"
	"sync"
	"testing"
)

// LockedBuffer is a bytes.Buffer that is safe for concurrent writes (a process's stdout and
// stderr, a stream and a log, a server's handlers) and reads from the test.
type LockedBuffer struct {
	mu     sync.Mutex
	buffer bytes.Buffer
}

func (b *LockedBuffer) Write(data []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buffer.Write(data)
}

// Bytes returns a copy of what was written.
func (b *LockedBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buffer.Bytes())
}

func (b *LockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buffer.String()
}

// RequireOneLine fails the test when err, returned by call (its text in the message, e.g.
// `ParseAllow("x")`), spans more than one line: every refusal the project prints is one line.
func RequireOneLine(t testing.TB, err error, call string) {
	t.Helper()
	if err != nil && strings.Contains(err.Error(), "\n") {
		t.Fatalf("%s: a multi-line error %q", call, err)
	}
}
