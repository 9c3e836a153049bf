//go:build security

package security

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	neturl "net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
)

// What deploy/local and tests/cluster/egress-proxy.sh set up: pool duo-proxied, whose pods reach
// nothing but the egress proxy at 10.99.2.2:3128 (admin API on :3129); the proxy allows
// gitlab.sandbox.test (10.99.1.2) and knows outside.sandbox.test (10.99.0.2) without allowing it.
const (
	proxiedPool = "duo-proxied"
	egressProxy = "http://10.99.2.2:3128"
	egressAdmin = localcluster.EgressAdminAddr
	// grantedDest is what the test pools grant each job beyond the proxy's own allowlist.
	grantedDest = "outside.sandbox.test:80"
)

// egressAdminClient talks to the local proxy's admin API directly, with its token.
func egressAdminClient(t *testing.T) *adminclient.Client {
	t.Helper()
	tokenFile, err := localcluster.EgressAdminTokenFile()
	if err != nil {
		t.Fatal(err)
	}
	token, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	hc, err := localcluster.EgressAdminHTTP(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return &adminclient.Client{Base: egressAdmin, Token: strings.TrimSpace(string(token)), HTTP: hc}
}

// blockedAttempts is what the proxy's admin API holds of client's refused attempts, one
// "METHOD dest: reason" line each.
func blockedAttempts(t *testing.T, client string) []string {
	t.Helper()
	b, err := egressAdminClient(t).QueryBlocked(context.Background(), client, time.Time{})
	if err != nil {
		t.Fatalf("the proxy's blocked attempts of %s: %v", client, err)
	}
	lines := make([]string, 0, len(b.Blocked))
	for _, d := range b.Blocked {
		lines = append(lines, fmt.Sprintf("%s %s: %s", d.Method, d.Dest, d.Reason))
	}
	return lines
}

// grantCall is one call of the grants API that reached the proxy, and how it answered.
type grantCall struct {
	Method, Client string
	Status         int
}

// grantRecorder stands between the executor and the proxy's admin API (the pool's egress_proxy
// is its URL: plain HTTP on loopback, then TLS to the proxy) and notes every grant call: the proxy can be asked what it blocked, not which
// grants it holds, so this is how a test sees each grant made and withdrawn.
type grantRecorder struct {
	URL   string
	mu    sync.Mutex
	calls []grantCall
}

func recordGrants(t *testing.T) *grantRecorder {
	t.Helper()
	target, err := neturl.Parse(egressAdmin)
	if err != nil {
		t.Fatal(err)
	}
	forward := httputil.NewSingleHostReverseProxy(target)
	hc, err := localcluster.EgressAdminHTTP(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	forward.Transport = hc.Transport
	g := &grantRecorder{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		forward.ServeHTTP(sw, r)
		if r.URL.Path == adminclient.GrantsPath {
			g.mu.Lock()
			g.calls = append(g.calls, grantCall{r.Method, r.URL.Query().Get("client"), sw.status})
			g.mu.Unlock()
		}
	}))
	t.Cleanup(srv.Close)
	g.URL = srv.URL
	return g
}

// Calls are the grant calls so far, in order.
func (g *grantRecorder) Calls() []grantCall {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]grantCall(nil), g.calls...)
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

// proxiedPools serve jobs without an image from the proxied pool, whose grants go to admin
// and allow grantedDest and the destinations of allow; the CI and POSIX images keep their pools.
func proxiedPools(admin string, allow ...string) []localcluster.PoolConfig {
	return append([]localcluster.PoolConfig{{Name: proxiedPool, EgressProxy: admin, EgressAllow: append([]string{grantedDest}, allow...)}},
		localcluster.Pools(localcluster.Pool)...)
}
