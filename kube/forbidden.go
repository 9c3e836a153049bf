package kube

import (
	"bytes"
	"context"
	"io"
	"math"
	"net/http"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
)

// A kube-apiserver that has just (re)started answers 403 Forbidden to every request until its
// RBAC authorizer has synced its informers: a few seconds in which a job's stage would fail as
// "RBAC denied" though nothing is wrong. The stages' contexts are marked to send a forbidden
// request again for a while; unmarked contexts see a 403 at once, as doctor must, which probes
// the executor's permissions.

// forbiddenBudget is how long after the first 403 a request may be sent again: the last try is
// no later than this.
const forbiddenBudget = 8 * time.Second

// forbiddenBackoff is the schedule of the tries after a 403: from 250 ms, doubling, to 2 s.
func forbiddenBackoff() wait.Backoff {
	return wait.Backoff{Duration: 250 * time.Millisecond, Factor: 2, Steps: math.MaxInt32, Cap: 2 * time.Second}
}

// forbiddenBodyLimit bounds the 403 body kept while the request is tried again (an API server's
// is a short Status).
const forbiddenBodyLimit = 64 << 10

type retryForbiddenKey struct{}

// RetryForbidden marks ctx so that API requests made with it are sent again when answered 403
// Forbidden, for about 8 s, as a restarted API server denies everything until its authorizer
// has synced. A denial that lasts is returned as the API server answered it.
func RetryForbidden(ctx context.Context) context.Context {
	return context.WithValue(ctx, retryForbiddenKey{}, true)
}

func retriesForbidden(ctx context.Context) bool {
	marked, _ := ctx.Value(retryForbiddenKey{}).(bool)
	return marked
}

// forbiddenRetry is the transport wrapper (RESTConfig installs it) that sends a request of a
// context marked by RetryForbidden again while it is answered 403. Every other answer, and every
// answer to an unmarked context, passes through on the first try.
type forbiddenRetry struct {
	next  http.RoundTripper
	clock clock.Clock
}

func (f *forbiddenRetry) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := f.next.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusForbidden || !retriesForbidden(req.Context()) || !resendable(req) {
		return resp, err
	}
	ctx := req.Context()
	start := f.clock.Now()
	backoff := forbiddenBackoff()
	for {
		// Keep the 403 (its body read, the connection free) to return it if no try is left.
		resp = kept(resp)
		delay := backoff.Step()
		if f.clock.Since(start)+delay > forbiddenBudget || !f.sleep(ctx, delay) {
			return resp, nil
		}
		again := req.Clone(ctx)
		if req.GetBody != nil {
			if again.Body, err = req.GetBody(); err != nil {
				return resp, nil
			}
		}
		next, err := f.next.RoundTrip(again)
		if err != nil || next.StatusCode != http.StatusForbidden {
			return next, err
		}
		resp = next
	}
}

// resendable tells whether req can be sent again as it was: its body can be had again, and it is
// not a stream upgrade (exec, attach, port-forward), whose round trippers hold the connection of
// a single try and would lose it to a second.
func resendable(req *http.Request) bool {
	if req.Header.Get("X-Stream-Protocol-Version") != "" || req.Header.Get("Sec-WebSocket-Protocol") != "" {
		return false
	}
	return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
}

// kept returns resp with its body read into memory and the original closed.
func kept(resp *http.Response) *http.Response {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, forbiddenBodyLimit))
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	return resp
}

// sleep waits d on the wrapper's clock; false if ctx ended first.
func (f *forbiddenRetry) sleep(ctx context.Context, d time.Duration) bool {
	t := f.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}
