package egress

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
)

func TestAdminBlockedEndpoint(t *testing.T) {
	rec := &Recorder{}
	rec.Record(blocked("10.88.0.5", time.Second, "evil.example:443"))
	rec.Record(blocked("10.88.0.6", time.Second, "other:443"))
	admin := &Admin{Recorder: rec, Allow: append([]netip.Prefix{netip.MustParsePrefix("10.99.2.0/24")}, DefaultAdminAllow...), Token: "a-token-of-32-characters-or-so!!"}
	const token = "Bearer a-token-of-32-characters-or-so!!"
	get := func(remote, target, auth string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, target, nil)
		req.RemoteAddr = remote
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		admin.ServeHTTP(w, req)
		return w
	}
	since := t0.Format(time.RFC3339Nano)
	cases := []struct {
		remote, target, auth string
		code                 int
		body                 string
	}{
		{"10.99.2.1:5000", "/v1/blocked?client=10.88.0.5&since=" + since, token, 200, `"dest":"evil.example:443"`},
		{"10.99.2.1:5000", "/v1/blocked?client=10.88.0.5&since=" + t0.Add(time.Hour).Format(time.RFC3339Nano), token, 200, `"blocked":[]`},
		{"127.0.0.1:5000", "/v1/blocked?client=10.88.0.5", "", 200, `"client":"10.88.0.5"`}, // loopback needs no token
		// A network of admin_allow is not trusted on its addresses alone: it sends the token.
		{"10.99.2.1:5000", "/v1/blocked?client=10.88.0.5", "", 403, "source 10.99.2.1 is not in admin_allow, or not loopback and sent no valid bearer token"},
		{"10.99.2.1:5000", "/v1/blocked?client=10.88.0.5", "Bearer wrong", 403, "forbidden"},
		// Nor is the token accepted from outside admin_allow.
		{"192.0.2.1:5000", "/v1/blocked?client=10.88.0.5", token, 403, "source 192.0.2.1 is not in admin_allow"},
		{"10.88.0.5:5000", "/v1/blocked?client=10.88.0.5", "", 403, "forbidden"}, // a job pod cannot read
		{"10.99.2.1:5000", "/v1/blocked?client=nope", token, 400, `client="nope" is not an IP address`},
		{"10.99.2.1:5000", "/v1/blocked", token, 400, "is not an IP address"},
		{"10.99.2.1:5000", "/v1/blocked?client=10.88.0.5&since=yesterday", token, 400, "not an RFC 3339 time"},
		{"192.0.2.1:5000", "/healthz", "", 200, "ok"}, // probes need neither
		{"10.99.2.1:5000", "/v1/other", "", 404, ""},
	}
	for _, c := range cases {
		w := get(c.remote, c.target, c.auth)
		if w.Code != c.code || !strings.Contains(w.Body.String(), c.body) {
			t.Errorf("%s from %s: %d %q, want %d containing %q", c.target, c.remote, w.Code, w.Body.String(), c.code, c.body)
		}
		if strings.Contains(w.Body.String(), "other:443") {
			t.Errorf("%s: another client's attempts leaked: %s", c.target, w.Body.String())
		}
	}
	req := httptest.NewRequest(http.MethodPost, "/v1/blocked?client=10.88.0.5", nil)
	req.RemoteAddr = "127.0.0.1:5000"
	w := httptest.NewRecorder()
	admin.ServeHTTP(w, req)
	if w.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", w.Code)
	}
}

func TestQueryBlocked(t *testing.T) {
	rec := &Recorder{}
	rec.Record(blocked("10.88.0.5", time.Second, "evil.example:443"))
	rec.Record(blocked("10.88.0.5", 3*time.Second, "later.example:443"))
	srv := httptest.NewServer(&Admin{Recorder: rec, Allow: DefaultAdminAllow})
	defer srv.Close()
	b, err := (&adminclient.Client{Base: srv.URL + "/", HTTP: srv.Client()}).QueryBlocked(context.Background(), "10.88.0.5", t0.Add(2*time.Second).In(time.FixedZone("X", 3600)))
	if err != nil || dests(*b) != "later.example:443" {
		t.Fatalf("QueryBlocked = %+v, %v", b, err)
	}
	if _, err := (&adminclient.Client{Base: srv.URL, HTTP: srv.Client()}).QueryBlocked(context.Background(), "not-an-ip", t0); err == nil || !strings.Contains(err.Error(), "400 Bad Request: egress proxy admin: client=") {
		t.Errorf("bad client: %v", err)
	}
	srv.Close()
	if _, err := (&adminclient.Client{Base: srv.URL, HTTP: srv.Client()}).QueryBlocked(context.Background(), "10.88.0.5", t0); err == nil {
		t.Error("a closed server answered")
	}
}
