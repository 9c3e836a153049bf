package clusterjobs

import (
	"testing"
	"time"
)

func TestLiveNotesArrivals(t *testing.T) {
	l := NewLive("first", "second")
	start := time.Now()
	l.Write([]byte("the fir"))
	if !l.At("first").IsZero() {
		t.Error("a marker arrived half-written")
	}
	l.Write([]byte("st line\n"))
	first := l.At("first")
	if first.Before(start) || !l.At("second").IsZero() {
		t.Errorf("first at %v, second at %v", first, l.At("second"))
	}
	go func() {
		time.Sleep(50 * time.Millisecond)
		l.Write([]byte("second\n"))
	}()
	if !l.Wait("second", 5*time.Second) {
		t.Fatal("Wait missed the second marker")
	}
	if l.At("second").Before(first) || l.At("first") != first {
		t.Errorf("arrival times moved: first %v then %v, second %v", first, l.At("first"), l.At("second"))
	}
	if l.Wait("never", 50*time.Millisecond) {
		t.Error("Wait found what never came")
	}
	if got := l.String(); got != "the first line\nsecond\n" {
		t.Errorf("output %q", got)
	}
}
