package clusterjobs

import (
	"strings"
	"sync"
	"time"
)

// Live is a stage's or a job's output as it arrives, for a test that acts while it runs: it takes
// a process's concurrent stdout and stderr writes, and notes when each of its markers first
// reached it.
type Live struct {
	mu      sync.Mutex
	text    strings.Builder
	markers map[string]time.Time
}

// NewLive is a Live that notes when each of markers arrives.
func NewLive(markers ...string) *Live {
	l := &Live{markers: map[string]time.Time{}}
	for _, m := range markers {
		l.markers[m] = time.Time{}
	}
	return l
}

func (l *Live) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.text.Write(p)
	for m, at := range l.markers {
		if at.IsZero() && strings.Contains(l.text.String(), m) {
			l.markers[m] = time.Now()
		}
	}
	return len(p), nil
}

// String is all output so far.
func (l *Live) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.text.String()
}

// At is when marker (one of NewLive's) first arrived; zero if it has not.
func (l *Live) At(marker string) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.markers[marker]
}

// Wait waits until text is in the output, for at most timeout, and says whether it is.
func (l *Live) Wait(text string, timeout time.Duration) bool { return l.WaitCount(text, 1, timeout) }

// WaitCount waits until text occurs at least n times in the output, for at most timeout, and
// says whether it does.
func (l *Live) WaitCount(text string, n int, timeout time.Duration) bool {
	for deadline := time.Now().Add(timeout); ; time.Sleep(20 * time.Millisecond) {
		if strings.Count(l.String(), text) >= n {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}
