// Package adminclient is the runner's side of the egress proxy's admin API: the job's egress
// grant (PutGrant, DeleteGrant) and its blocked attempts (QueryBlocked), and the wire types both
// sides share. It imports nothing of the proxy's server (package egress), so that the stages,
// which the runner starts for every job, do not link it.
package adminclient

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// BlockedPath is the read endpoint: GET /v1/blocked?client=<IP>&since=<RFC3339Nano>.
const BlockedPath = "/v1/blocked"

// GrantsPath is the endpoint through which runners widen one job pod's allowlist for the
// job's lifetime: PUT /v1/grants?client=<IP> with a Grant, DELETE /v1/grants?client=<IP>;
// GET /v1/grants lists the grants in force (LiveGrants).
const GrantsPath = "/v1/grants"

// Timeout bounds one call to the admin endpoint: a proxy that does not answer costs a stage at
// most this.
const Timeout = 2 * time.Second

// Reasons a destination is blocked.
const (
	ReasonNotAllowed     = "not in the allowlist"
	ReasonBadDest        = "not a valid destination"
	ReasonNonPublicIP    = "its name resolves to a non-public address (private, loopback, link-local, ...) that no rule names"
	ReasonTooManyTunnels = "the pod has too many connections open through the proxy (max_tunnels_per_client)"
)

// Grant is the body of PUT /v1/grants: allowlist entries (the syntax of allow) for one client
// until a time, after which they lapse even if no one deletes them (a runner that died).
type Grant struct {
	Allow []string `json:"allow,omitempty"`
	// Instance are the entries of the job's GitLab instance: their names may resolve to
	// private addresses (an on-premises instance), which Allow's may not.
	Instance []string  `json:"instance,omitempty"`
	Until    time.Time `json:"until"`
}

// LiveGrants is the answer of GET /v1/grants: the grants in force, by client.
type LiveGrants struct {
	Grants []LiveGrant `json:"grants"`
}

// LiveGrant is one client's grant in force, and when it lapses.
type LiveGrant struct {
	Client string    `json:"client"`
	Until  time.Time `json:"until"`
}

// Decision is one proxy decision, logged as a JSON line and kept in memory when blocked.
type Decision struct {
	Time    time.Time `json:"time"`
	Client  string    `json:"client"`
	Method  string    `json:"method"`
	Dest    string    `json:"dest"`
	Allowed bool      `json:"allowed"`
	// Rule is the allowlist entry that allowed it.
	Rule string `json:"rule,omitempty"`
	// Reason says why it was blocked.
	Reason string `json:"reason,omitempty"`
	// Error is why an allowed destination could not be reached.
	Error string `json:"error,omitempty"`
}

// Blocked is the answer of the blocked-attempts endpoint.
type Blocked struct {
	Client  string     `json:"client"`
	Blocked []Decision `json:"blocked"`
	// Truncated: some attempts after Since were overwritten; the JSON log has them all.
	Truncated bool `json:"truncated,omitempty"`
}

// direct talks to the proxy's admin address directly: never through a proxy from the runner's
// environment.
var direct = HTTPClient(nil)

// HTTPClient is a client for the admin API: direct (never through a proxy from the runner's
// environment), bounded by Timeout, and for https:// addresses TLS 1.2 or later with the
// proxy's certificate verified against roots (nil: the system's roots).
func HTTPClient(roots *x509.CertPool) *http.Client {
	return &http.Client{Timeout: Timeout, Transport: &http.Transport{
		Proxy:           nil,
		TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots},
	}}
}

// Client calls one egress proxy's admin endpoint.
type Client struct {
	// Base is the admin address, e.g. "https://10.0.0.5:3129" (a pool's egress_proxy).
	Base string
	// Token, if set, is sent as "Authorization: Bearer <token>" (the proxy's admin_token_file).
	Token string
	// CA verifies an https Base's certificate (the executor's egress_admin_ca_file; nil: the
	// system's roots). Not used with HTTP.
	CA *x509.CertPool
	// HTTP is the HTTP client (nil: HTTPClient(CA)).
	HTTP *http.Client
}

// QueryBlocked asks for the client's blocked attempts since a time.
func (c *Client) QueryBlocked(ctx context.Context, client string, since time.Time) (*Blocked, error) {
	query := url.Values{"client": {client}, "since": {since.UTC().Format(time.RFC3339Nano)}}
	resp, err := c.do(ctx, http.MethodGet, BlockedPath, query, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body := io.LimitReader(resp.Body, 4<<20)
	if resp.StatusCode != http.StatusOK {
		return nil, statusError(resp.Status, body)
	}
	var b Blocked
	if err := json.NewDecoder(body).Decode(&b); err != nil {
		return nil, fmt.Errorf("reading the answer: %v", err)
	}
	return &b, nil
}

// ListGrants asks for the grants in force.
func (c *Client) ListGrants(ctx context.Context) ([]LiveGrant, error) {
	resp, err := c.do(ctx, http.MethodGet, GrantsPath, url.Values{}, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body := io.LimitReader(resp.Body, 4<<20)
	if resp.StatusCode != http.StatusOK {
		return nil, statusError(resp.Status, body)
	}
	var live LiveGrants
	if err := json.NewDecoder(body).Decode(&live); err != nil {
		return nil, fmt.Errorf("reading the answer: %v", err)
	}
	return live.Grants, nil
}

// PutGrant gives client the allowlist entries of grant until its time.
func (c *Client) PutGrant(ctx context.Context, client string, grant Grant) error {
	body, err := json.Marshal(grant)
	if err != nil {
		return err
	}
	return c.grantCall(ctx, http.MethodPut, client, strings.NewReader(string(body)))
}

// DeleteGrant removes client's grant.
func (c *Client) DeleteGrant(ctx context.Context, client string) error {
	return c.grantCall(ctx, http.MethodDelete, client, nil)
}

func (c *Client) grantCall(ctx context.Context, method, client string, body io.Reader) error {
	resp, err := c.do(ctx, method, GrantsPath, url.Values{"client": {client}}, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return statusError(resp.Status, io.LimitReader(resp.Body, 4096))
	}
	return nil
}

func (c *Client) do(ctx context.Context, method, path string, query url.Values, body io.Reader) (*http.Response, error) {
	u := strings.TrimSuffix(c.Base, "/") + path + "?" + query.Encode()
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	hc := c.HTTP
	switch {
	case hc != nil:
	case c.CA != nil:
		hc = HTTPClient(c.CA)
	default:
		hc = direct
	}
	return hc.Do(req)
}

// RefusedError is the proxy's answer refusing a call, which therefore changed nothing; any
// other error leaves open whether the proxy did what was asked.
type RefusedError struct {
	Status string // e.g. "403 Forbidden"
	Line   string // the first line of the proxy's answer
}

func (e *RefusedError) Error() string { return e.Status + ": " + e.Line }

// statusError is a refusal as one line: the status and the first line of the proxy's answer.
func statusError(status string, body io.Reader) error {
	line, _ := bufio.NewReader(body).ReadString('\n')
	line = strings.TrimSpace(line)
	if len(line) > 200 {
		line = line[:200] + "..."
	}
	return &RefusedError{Status: status, Line: line}
}
