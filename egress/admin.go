package egress

import (
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
)

// Admin serves the blocked attempts per client and takes the grants, from the sources of Allow:
// on loopback as they are, from elsewhere with the token.
type Admin struct {
	Recorder *Recorder
	// Grants receives the per-job additions to the allowlist (nil: PUT/DELETE /v1/grants answer 404).
	Grants *Grants
	// Now is the clock grants are checked against (nil: time.Now).
	Now func() time.Time
	// Allow lists the source networks that may call (e.g. loopback, the runners').
	Allow []netip.Prefix
	// Token is required as "Authorization: Bearer <token>" from every source but loopback.
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
	case adminclient.BlockedPath:
	case adminclient.GrantsPath:
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
	if r.Method == http.MethodGet && !r.URL.Query().Has("client") {
		// The live grants, for an operator (or a soak) to see that finished jobs left none.
		if !a.authorized(r) {
			a.forbid(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(adminclient.LiveGrants{Grants: a.Grants.Live(a.now())})
		return
	}
	if r.Method != http.MethodPut && r.Method != http.MethodDelete {
		http.Error(w, "egress proxy admin: use GET, PUT or DELETE", http.StatusMethodNotAllowed)
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
	var grant adminclient.Grant
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&grant); err != nil {
		http.Error(w, "egress proxy admin: the grant is not JSON {\"allow\":[...],\"until\":\"RFC 3339\"}", http.StatusBadRequest)
		return
	}
	if err := a.Grants.Put(client, grant, a.now()); err != nil {
		http.Error(w, "egress proxy admin: grant refused: "+truncateErr(err), http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *Admin) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

// forbid answers a source that is not trusted.
func (a *Admin) forbid(w http.ResponseWriter, r *http.Request) {
	http.Error(w, "egress proxy admin: forbidden: source "+clientIP(r.RemoteAddr)+" is not in admin_allow, or not loopback and sent no valid bearer token", http.StatusForbidden)
}

// trustedClient answers a request from an untrusted source with 403, and one without a valid
// client= address with 400; otherwise it returns the client the request is about.
func (a *Admin) trustedClient(w http.ResponseWriter, r *http.Request) (netip.Addr, bool) {
	if !a.authorized(r) {
		a.forbid(w, r)
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

// authorized admits a source of Allow that is loopback, or that sends the token: no network
// but this machine's is trusted on its address alone.
func (a *Admin) authorized(r *http.Request) bool {
	src, err := netip.ParseAddr(clientIP(r.RemoteAddr))
	if err != nil || !slices.ContainsFunc(a.Allow, func(p netip.Prefix) bool { return p.Contains(src) }) {
		return false
	}
	if src.IsLoopback() {
		return true
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return a.Token != "" && ok && subtle.ConstantTimeCompare([]byte(got), []byte(a.Token)) == 1
}
