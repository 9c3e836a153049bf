package kube

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"
)

// scriptedServer answers each request with the next status of its script (the last one once the
// script is spent), and records what it was sent and when, on the fake clock.
type scriptedServer struct {
	clock    *testingclock.FakeClock
	statuses []int

	mu     sync.Mutex
	bodies []string
	at     []time.Duration // since the clock's start
	sent   []*closeRecorder
}

var clockStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func newScriptedServer(statuses ...int) *scriptedServer {
	return &scriptedServer{clock: testingclock.NewFakeClock(clockStart), statuses: statuses}
}

func (s *scriptedServer) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		_ = req.Body.Close()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bodies = append(s.bodies, string(body))
	s.at = append(s.at, s.clock.Since(clockStart))
	status := s.statuses[min(len(s.bodies), len(s.statuses))-1]
	answer := &closeRecorder{Reader: strings.NewReader(fmt.Sprintf("%s answer %d", http.StatusText(status), len(s.bodies)))}
	s.sent = append(s.sent, answer)
	return &http.Response{StatusCode: status, Body: answer, Header: http.Header{}, Request: req}, nil
}

func (s *scriptedServer) requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.bodies)
}

type closeRecorder struct {
	io.Reader
	closed bool
}

func (c *closeRecorder) Close() error {
	c.closed = true
	return nil
}

// roundTrip sends req through a forbiddenRetry on the server's fake clock, stepping the clock by
// 250 ms (every wait of the schedule is a multiple) whenever the wrapper waits on it.
func roundTrip(t *testing.T, srv *scriptedServer, req *http.Request) *http.Response {
	t.Helper()
	rt := &forbiddenRetry{next: srv, clock: srv.clock}
	type result struct {
		resp *http.Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := rt.RoundTrip(req)
		done <- result{resp, err}
	}()
	for {
		select {
		case r := <-done:
			if r.err != nil {
				t.Fatal(r.err)
			}
			return r.resp
		default:
		}
		if srv.clock.HasWaiters() {
			srv.clock.Step(250 * time.Millisecond)
		} else {
			time.Sleep(time.Millisecond)
		}
	}
}

func request(t *testing.T, ctx context.Context, method, body string) *http.Request {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "https://kube.example/api/v1/namespaces/ns/pods", r)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func answer(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestForbiddenIsSentAgainWithItsBody(t *testing.T) {
	srv := newScriptedServer(http.StatusForbidden, http.StatusOK)
	resp := roundTrip(t, srv, request(t, RetryForbidden(context.Background()), http.MethodPost, `{"kind":"Pod"}`))
	if resp.StatusCode != http.StatusOK || answer(t, resp) != "OK answer 2" {
		t.Fatalf("answer %d, want the second request's 200", resp.StatusCode)
	}
	if len(srv.bodies) != 2 || srv.bodies[0] != `{"kind":"Pod"}` || srv.bodies[1] != srv.bodies[0] {
		t.Fatalf("sent %q, want the body twice", srv.bodies)
	}
	if srv.at[1] != 250*time.Millisecond {
		t.Errorf("sent again after %v, want 250ms", srv.at[1])
	}
	if !srv.sent[0].closed {
		t.Error("the 403's body was not closed")
	}
}

func TestALastingForbiddenIsReturnedAfterTheBudget(t *testing.T) {
	srv := newScriptedServer(http.StatusForbidden)
	resp := roundTrip(t, srv, request(t, RetryForbidden(context.Background()), http.MethodGet, ""))
	if resp.StatusCode != http.StatusForbidden || answer(t, resp) != "Forbidden answer 7" {
		t.Fatalf("answer %d, want the last 403 as the server sent it", resp.StatusCode)
	}
	// 250 ms doubling to 2 s; the next wait would end 9.75 s after the first 403, past 8 s.
	want := []time.Duration{0, 250 * time.Millisecond, 750 * time.Millisecond, 1750 * time.Millisecond, 3750 * time.Millisecond, 5750 * time.Millisecond, 7750 * time.Millisecond}
	if len(srv.at) != len(want) {
		t.Fatalf("sent at %v, want %v", srv.at, want)
	}
	for i := range want {
		if srv.at[i] != want[i] {
			t.Fatalf("sent at %v, want %v", srv.at, want)
		}
	}
	for i, body := range srv.sent[:len(srv.sent)-1] {
		if !body.closed {
			t.Errorf("the body of 403 number %d was not closed", i+1)
		}
	}
}

func TestAnUnmarkedContextGetsItsForbiddenAtOnce(t *testing.T) {
	srv := newScriptedServer(http.StatusForbidden, http.StatusOK)
	resp := roundTrip(t, srv, request(t, context.Background(), http.MethodGet, ""))
	if resp.StatusCode != http.StatusForbidden || srv.requests() != 1 {
		t.Fatalf("answer %d after %d requests, want the 403 of the first", resp.StatusCode, srv.requests())
	}
	if srv.sent[0].closed {
		t.Error("the 403 returned had its body closed")
	}
}

func TestOnlyForbiddenIsSentAgain(t *testing.T) {
	for _, status := range []int{http.StatusInternalServerError, http.StatusNotFound, http.StatusUnauthorized, http.StatusTooManyRequests} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			srv := newScriptedServer(status, http.StatusOK)
			resp := roundTrip(t, srv, request(t, RetryForbidden(context.Background()), http.MethodGet, ""))
			if resp.StatusCode != status || srv.requests() != 1 {
				t.Fatalf("answer %d after %d requests, want the %d of the first", resp.StatusCode, srv.requests(), status)
			}
		})
	}
}

func TestAnEndedContextGetsItsForbiddenWithoutWaiting(t *testing.T) {
	srv := newScriptedServer(http.StatusForbidden, http.StatusOK)
	ctx, cancel := context.WithCancel(RetryForbidden(context.Background()))
	cancel()
	resp, err := (&forbiddenRetry{next: srv, clock: srv.clock}).RoundTrip(request(t, ctx, http.MethodGet, ""))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusForbidden || srv.requests() != 1 || answer(t, resp) != "Forbidden answer 1" {
		t.Fatalf("answer %d after %d requests, want the first 403", resp.StatusCode, srv.requests())
	}
}

func TestARequestThatCannotBeSentAsItWasGetsItsForbiddenAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  func(*http.Request)
	}{
		{"a body that cannot be read again", func(r *http.Request) { r.Body, r.GetBody = io.NopCloser(strings.NewReader("{}")), nil }},
		{"an exec stream over SPDY", func(r *http.Request) { r.Header.Set("X-Stream-Protocol-Version", "v5.channel.k8s.io") }},
		{"an exec stream over WebSocket", func(r *http.Request) { r.Header.Set("Sec-WebSocket-Protocol", "v5.channel.k8s.io") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newScriptedServer(http.StatusForbidden, http.StatusOK)
			req := request(t, RetryForbidden(context.Background()), http.MethodPost, "")
			tc.req(req)
			resp := roundTrip(t, srv, req)
			if resp.StatusCode != http.StatusForbidden || srv.requests() != 1 {
				t.Fatalf("answer %d after %d requests, want the 403 of the first", resp.StatusCode, srv.requests())
			}
		})
	}
}
