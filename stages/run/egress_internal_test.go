package run

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/egress"
	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/fakecluster"
	"github.com/sandbox-executor/sandbox-executor/stages"
)

func TestReportBlockedNamesEachDestinationOnce(t *testing.T) {
	start := time.Now()
	rec := &egress.Recorder{}
	block := func(client, method, dest, reason string, at time.Time) {
		rec.Record(adminclient.Decision{Time: at, Client: client, Method: method, Dest: dest, Reason: reason})
	}
	block("10.88.0.5", "CONNECT", "before.example:443", adminclient.ReasonNotAllowed, start.Add(-time.Second)) // an earlier stage
	block("10.88.0.5", "CONNECT", "evil.example:443", adminclient.ReasonNotAllowed, start.Add(time.Millisecond))
	block("10.88.0.5", "CONNECT", "evil.example:443", adminclient.ReasonNotAllowed, start.Add(2*time.Millisecond))
	block("10.88.0.5", "GET", "evil.example:80", adminclient.ReasonNotAllowed, start.Add(3*time.Millisecond))
	block("10.88.0.5", "CONNECT", "meta.example:80", adminclient.ReasonNonPublicIP, start.Add(4*time.Millisecond))
	block("10.88.0.6", "CONNECT", "neighbour.example:443", adminclient.ReasonNotAllowed, start.Add(time.Millisecond)) // another pod
	srv := httptest.NewServer(&egress.Admin{Recorder: rec, Allow: egress.DefaultAdminAllow})
	defer srv.Close()

	var out bytes.Buffer
	reportBlocked(context.Background(), noToken, fakecluster.JobLog(&out), &config.Pool{Name: "duo-proxied", EgressProxy: srv.URL}, "10.88.0.5", start)
	got := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{
		"WARNING: egress blocked: CONNECT evil.example:443 (not in the allowlist of pool duo-proxied; 2 attempts)",
		"WARNING: egress blocked: GET evil.example:80 (not in the allowlist of pool duo-proxied)",
		"WARNING: egress blocked: CONNECT meta.example:80 (" + adminclient.ReasonNonPublicIP + "; pool duo-proxied)",
	}
	if len(got) != len(want) {
		t.Fatalf("job log:\n%s\nwant %d lines", out.String(), len(want))
	}
	for i := range want {
		if !strings.Contains(got[i], want[i]) {
			t.Errorf("line %d: %q, want %q", i, got[i], want[i])
		}
	}
}

func TestReportBlockedIsBounded(t *testing.T) {
	start := time.Now()
	rec := &egress.Recorder{PerClient: 30}
	for i := 0; i < 40; i++ {
		rec.Record(adminclient.Decision{Time: start.Add(time.Duration(i+1) * time.Millisecond), Client: "10.88.0.5", Method: "CONNECT", Dest: fmt.Sprintf("h%d.example:443", i), Reason: adminclient.ReasonNotAllowed})
	}
	srv := httptest.NewServer(&egress.Admin{Recorder: rec, Allow: egress.DefaultAdminAllow})
	defer srv.Close()
	var out bytes.Buffer
	reportBlocked(context.Background(), noToken, fakecluster.JobLog(&out), &config.Pool{Name: "p", EgressProxy: srv.URL}, "10.88.0.5", start)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != maxBlockedLines+2 || !strings.Contains(lines[maxBlockedLines], "10 more destinations") || !strings.Contains(lines[maxBlockedLines+1], "more attempts than the egress proxy keeps") {
		t.Errorf("job log (%d lines):\n%s", len(lines), out.String())
	}
}

// An unreachable or refusing proxy is one warning line, and pools without a proxy ask nothing.
func TestReportBlockedNeverFailsTheJob(t *testing.T) {
	var asked atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		http.Error(w, "egress proxy admin: forbidden: source 127.0.0.1 is not in admin_allow", http.StatusForbidden)
	}))
	defer srv.Close()
	var out bytes.Buffer
	log := fakecluster.JobLog(&out)
	reportBlocked(context.Background(), noToken, log, &config.Pool{Name: "p", EgressProxy: srv.URL}, "10.88.0.5", time.Now())
	if s := out.String(); strings.Count(s, "\n") != 1 || !strings.Contains(s, "WARNING: egress proxy "+srv.URL+": cannot list blocked attempts: 403 Forbidden: egress proxy admin: forbidden") {
		t.Errorf("refused: %q", s)
	}
	out.Reset()
	reportBlocked(context.Background(), noToken, log, &config.Pool{Name: "p"}, "10.88.0.5", time.Now())
	reportBlocked(context.Background(), noToken, log, nil, "10.88.0.5", time.Now())
	if out.Len() != 0 || asked.Load() != 1 {
		t.Errorf("a pool without egress_proxy: %q, %d queries", out.String(), asked.Load())
	}
	srv.Close()
	reportBlocked(context.Background(), noToken, log, &config.Pool{Name: "p", EgressProxy: srv.URL}, "10.88.0.5", time.Now())
	if s := out.String(); strings.Count(s, "\n") != 1 || !strings.Contains(s, "cannot list blocked attempts") {
		t.Errorf("unreachable: %q", s)
	}
}

// noToken is a stage's env whose config sets no egress_admin_token_file.
var noToken = &stages.Env{Config: &config.Config{}}
