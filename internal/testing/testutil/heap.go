package testutil

import (
	"io"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// PeakHeap samples the process's live heap (runtime.MemStats.HeapAlloc) until the test ends or
// the returned stop is called, which returns the highest sample. Over reports whether a sample
// went over limit: a hostile peer in a test can stop sending then, so that a regression fails
// the test instead of exhausting the machine's memory.
type PeakHeap struct {
	limit uint64
	peak  atomic.Uint64
	done  chan struct{}
	ended chan struct{}
}

// WatchHeap starts sampling every 2 ms, after a collection so that earlier tests' garbage does
// not count.
func WatchHeap(t testing.TB, limit uint64) *PeakHeap {
	runtime.GC()
	h := &PeakHeap{limit: limit, done: make(chan struct{}), ended: make(chan struct{})}
	go func() {
		defer close(h.ended)
		var ms runtime.MemStats
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > h.peak.Load() {
				h.peak.Store(ms.HeapAlloc)
			}
			select {
			case <-h.done:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { h.Stop() })
	return h
}

// Over reports whether the heap went over the limit so far.
func (h *PeakHeap) Over() bool { return h.peak.Load() > h.limit }

// Stop ends the sampling and returns the peak.
func (h *PeakHeap) Stop() uint64 {
	select {
	case <-h.done:
	default:
		close(h.done)
	}
	<-h.ended
	return h.peak.Load()
}

// Flood is a reader of n bytes of fill, made as they are read (a gigabyte costs no memory),
// that ends early once stop reports true.
type Flood struct {
	N    int64
	Fill byte
	Stop func() bool
}

func (f *Flood) Read(p []byte) (int, error) {
	if f.N <= 0 || (f.Stop != nil && f.Stop()) {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), f.N))
	for i := range p[:n] {
		p[i] = f.Fill
	}
	f.N -= int64(n)
	return n, nil
}
