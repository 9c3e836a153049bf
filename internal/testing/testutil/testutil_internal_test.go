package testutil

import (
	"strings"
	"sync"
	"testing"
)

func TestLockedBufferConcurrentWrites(t *testing.T) {
	var b LockedBuffer
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 100; j++ {
				b.Write([]byte("x"))
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	if got := b.String(); got != strings.Repeat("x", 800) {
		t.Errorf("got %d bytes, want 800", len(got))
	}
	c := b.Bytes()
	c[0] = 'y'
	if b.String()[0] != 'x' {
		t.Error("Bytes returned the buffer itself, not a copy")
	}
}
