package egress

import (
	"bufio"
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"
)

// BlockedPath is the read endpoint: GET /v1/blocked?client=<IP>&since=<RFC3339Nano>.
const BlockedPath = "/v1/blocked"

// Admin serves the blocked attempts per client to runners (trusted by source address) and to
// anyone holding the token.
type Admin struct {
	Recorder *Recorder
	// Grants receives the per-job additions to the allowlist (nil: PUT/DELETE /v1/grants answer 404).
	Grants *Grants
	// Now is the clock grants are checked against (nil: time.Now).
	Now func() time.Time
	// Allow lists the source networks trusted without a token (e.g. loopback, the runners').
	Allow []netip.Prefix
	// Token, if set, is accepted as "Authorization: Bearer <token>" from any source.
	Token string
}

// DefaultAdminAllow trusts this machine only.
var DefaultAdminAllow = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

// ServeHTTP implements http.Handler.
func (a *Admin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/healthz":
		io.WriteString(w, "ok\n")
		return
	case BlockedPath:
	case GrantsPath:
		if a.Grants == nil {
			http.NotFound(w, r)
			return
		}
		a.serveGrants(w, r)
		return
	default:
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodGet {
		http.Error(w, "egress proxy admin: use GET", http.StatusMethodNotAllowed)
		return
	}
	client, ok := a.trustedClient(w, r)
	if !ok {
		return
	}
	var since time.Time
	if s := r.URL.Query().Get("since"); s != "" {
		var err error
		if since, err = time.Parse(time.RFC3339Nano, s); err != nil {
			http.Error(w, fmt.Sprintf("egress proxy admin: since=%q is not an RFC 3339 time", truncate(s, 64)), http.StatusBadRequest)
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(a.Recorder.Blocked(client, since))
}

// serveGrants answers PUT (replace the client's grant) and DELETE (remove it), from the same
// trusted sources as the blocked attempts: a job pod must never widen its own allowlist.
func (a *Admin) serveGrants(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPut && r.Method != http.MethodDelete {
		http.Error(w, "egress proxy admin: use PUT or DELETE", http.StatusMethodNotAllowed)
		return
	}
	client, ok := a.trustedClient(w, r)
	if !ok {
		return
	}
	if r.Method == http.MethodDelete {
		a.Grants.Delete(client)
		w.WriteHeader(http.StatusNoContent)
		return
	}
	var grant Grant
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&grant); err != nil {
		http.Error(w, "egress proxy admin: the grant is not JSON {\"allow\":[...],\"until\":\"RFC 3339\"}", http.StatusBadRequest)
		return
	}
	now := time.Now
	if a.Now != nil {
		now = a.Now
	}
	if err := a.Grants.Put(client, grant, now()); err != nil {
		http.Error(w, "egress proxy admin: grant refused: "+truncateErr(err), http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// trustedClient answers a request from an untrusted source with 403, and one without a valid
// client= address with 400; otherwise it returns the client the request is about.
func (a *Admin) trustedClient(w http.ResponseWriter, r *http.Request) (netip.Addr, bool) {
	if !a.authorized(r) {
		http.Error(w, "egress proxy admin: forbidden: source "+clientIP(r.RemoteAddr)+" is not in admin_allow and no valid bearer token was sent", http.StatusForbidden)
		return netip.Addr{}, false
	}
	q := r.URL.Query().Get("client")
	client, err := netip.ParseAddr(q)
	if err != nil {
		http.Error(w, fmt.Sprintf("egress proxy admin: client=%q is not an IP address", truncate(q, 64)), http.StatusBadRequest)
		return netip.Addr{}, false
	}
	return client, true
}

func (a *Admin) authorized(r *http.Request) bool {
	if a.Token != "" {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if ok && subtle.ConstantTimeCompare([]byte(got), []byte(a.Token)) == 1 {
			return true
		}
	}
	src, err := netip.ParseAddr(clientIP(r.RemoteAddr))
	if err != nil {
		return false
	}
	for _, p := range a.Allow {
		if p.Contains(src.Unmap()) {
			return true
		}
	}
	return false
}

// QueryBlocked asks the admin endpoint at base (e.g. "http://10.0.0.5:3129") for the client's
// blocked attempts since a time.
func QueryBlocked(ctx context.Context, hc *http.Client, base, client string, since time.Time) (*Blocked, error) {
	u := strings.TrimSuffix(base, "/") + BlockedPath + "?" + url.Values{
		"client": {client}, "since": {since.UTC().Format(time.RFC3339Nano)},
	}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body := io.LimitReader(resp.Body, 4<<20)
	if resp.StatusCode != http.StatusOK {
		line, _ := bufio.NewReader(body).ReadString('\n')
		return nil, fmt.Errorf("%s: %s", resp.Status, truncate(strings.TrimSpace(line), 200))
	}
	var b Blocked
	if err := json.NewDecoder(body).Decode(&b); err != nil {
		return nil, fmt.Errorf("reading the answer: %v", err)
	}
	return &b, nil
}

// PutGrant gives client the allowlist entries allow until a time, through the admin endpoint at base.
func PutGrant(ctx context.Context, hc *http.Client, base, client string, grant Grant) error {
	body, err := json.Marshal(grant)
	if err != nil {
		return err
	}
	return adminCall(ctx, hc, http.MethodPut, base, client, strings.NewReader(string(body)))
}

// DeleteGrant removes client's grant through the admin endpoint at base.
func DeleteGrant(ctx context.Context, hc *http.Client, base, client string) error {
	return adminCall(ctx, hc, http.MethodDelete, base, client, nil)
}

func adminCall(ctx context.Context, hc *http.Client, method, base, client string, body io.Reader) error {
	u := strings.TrimSuffix(base, "/") + GrantsPath + "?" + url.Values{"client": {client}}.Encode()
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		line, _ := bufio.NewReader(io.LimitReader(resp.Body, 4096)).ReadString('\n')
		return fmt.Errorf("%s: %s", resp.Status, truncate(strings.TrimSpace(line), 200))
	}
	return nil
}

// AdminTimeout bounds one call to the admin endpoint: a proxy that does not answer costs a
// stage at most this.
const AdminTimeout = 2 * time.Second

// AdminClient talks to the proxy's admin address directly: never through a proxy from the
// runner's environment.
var AdminClient = &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: AdminTimeout}
