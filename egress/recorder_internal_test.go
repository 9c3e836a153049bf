package egress

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
)

var t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

func blocked(client string, at time.Duration, dest string) adminclient.Decision {
	return adminclient.Decision{Time: t0.Add(at), Client: client, Method: "CONNECT", Dest: dest, Reason: adminclient.ReasonNotAllowed}
}

func dests(b adminclient.Blocked) string {
	var s []string
	for _, d := range b.Blocked {
		s = append(s, d.Dest)
	}
	return strings.Join(s, ",")
}

func TestRecorderFiltersByClientAndTime(t *testing.T) {
	var log bytes.Buffer
	r := &Recorder{Out: &log}
	r.Record(blocked("10.88.0.5", 1*time.Second, "a:443"))
	r.Record(blocked("10.88.0.6", 2*time.Second, "other-client:443"))
	r.Record(adminclient.Decision{Time: t0.Add(3 * time.Second), Client: "10.88.0.5", Method: "CONNECT", Dest: "ok:443", Allowed: true, Rule: "ok:443"})
	r.Record(blocked("10.88.0.5", 4*time.Second, "b:443"))
	r.Record(blocked("::ffff:10.88.0.5", 5*time.Second, "c:443"))

	client := netip.MustParseAddr("10.88.0.5")
	if got := dests(r.Blocked(client, time.Time{})); got != "a:443,b:443,c:443" {
		t.Errorf("all blocked of 10.88.0.5 = %s", got)
	}
	if got := dests(r.Blocked(client, t0.Add(4*time.Second))); got != "b:443,c:443" {
		t.Errorf("since +4s (inclusive) = %s", got)
	}
	if got := r.Blocked(client, t0.Add(time.Minute)); len(got.Blocked) != 0 || got.Blocked == nil || got.Truncated {
		t.Errorf("since later = %+v, want an empty (non-nil) list", got)
	}
	if got := r.Blocked(netip.MustParseAddr("10.88.0.7"), time.Time{}); len(got.Blocked) != 0 || got.Client != "10.88.0.7" {
		t.Errorf("unknown client = %+v", got)
	}

	// Every decision, allowed or not, is one JSON line.
	lines := strings.Split(strings.TrimSpace(log.String()), "\n")
	if len(lines) != 5 {
		t.Fatalf("%d log lines, want 5:\n%s", len(lines), log.String())
	}
	var d adminclient.Decision
	if err := json.Unmarshal([]byte(lines[2]), &d); err != nil || !d.Allowed || d.Rule != "ok:443" || d.Client != "10.88.0.5" || d.Method != "CONNECT" || !d.Time.Equal(t0.Add(3*time.Second)) {
		t.Errorf("allowed line %s -> %+v %v", lines[2], d, err)
	}
	if !strings.Contains(lines[0], `"allowed":false`) || !strings.Contains(lines[0], `"reason":"not in the allowlist"`) || !strings.Contains(lines[0], `"dest":"a:443"`) {
		t.Errorf("blocked line: %s", lines[0])
	}
}

func TestRecorderMemoryIsBounded(t *testing.T) {
	r := &Recorder{PerClient: 4, MaxClients: 3}
	for c := 0; c < 10; c++ {
		for i := 0; i < 10; i++ {
			r.Record(blocked(fmt.Sprintf("10.88.1.%d", c), time.Duration(c*100+i)*time.Second, fmt.Sprintf("d%d:443", i)))
		}
	}
	if n := r.clientCount(); n != 3 {
		t.Errorf("%d clients kept, want 3", n)
	}
	// The least recently active clients went first.
	if got := r.Blocked(netip.MustParseAddr("10.88.1.0"), time.Time{}); len(got.Blocked) != 0 {
		t.Errorf("evicted client still has %s", dests(got))
	}
	last := netip.MustParseAddr("10.88.1.9")
	got := r.Blocked(last, time.Time{})
	if dests(got) != "d6:443,d7:443,d8:443,d9:443" || !got.Truncated {
		t.Errorf("newest 4 of 10 = %s truncated %v, want d6-d9 and truncated", dests(got), got.Truncated)
	}
	// Truncated only when attempts after since were lost.
	if got := r.Blocked(last, t0.Add(906*time.Second)); dests(got) != "d6:443,d7:443,d8:443,d9:443" || got.Truncated {
		t.Errorf("since the oldest kept: %s truncated %v", dests(got), got.Truncated)
	}
	// Long fields are cut.
	r.Record(blocked("10.88.1.9", time.Hour, strings.Repeat("x", 10000)))
	if got := r.Blocked(last, t0.Add(time.Hour)); len(got.Blocked) != 1 || len(got.Blocked[0].Dest) > maxDestLen+3 {
		t.Errorf("a 10000-byte destination kept as %d bytes", len(got.Blocked[0].Dest))
	}
}

// Decisions of one client from many goroutines: no race, none lost below the bound.
func TestRecorderConcurrent(t *testing.T) {
	r := &Recorder{PerClient: 1000}
	done := make(chan struct{})
	for g := 0; g < 8; g++ {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := 0; i < 100; i++ {
				r.Record(blocked("10.88.0.9", time.Duration(i), "x:443"))
				r.Blocked(netip.MustParseAddr("10.88.0.9"), time.Time{})
			}
		}()
	}
	for g := 0; g < 8; g++ {
		<-done
	}
	if n := len(r.Blocked(netip.MustParseAddr("10.88.0.9"), time.Time{}).Blocked); n != 800 {
		t.Errorf("%d decisions kept, want 800", n)
	}
}
