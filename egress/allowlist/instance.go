package allowlist

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// InstanceRules are the allowlist entries that let a job reach its GitLab instance, derived
// from the job's CI_SERVER_URL (and CI_SERVER_HOST, which must agree with it) the way SRT in
// GitLab's default flow image derives its allowlist: the instance's host on ports 80 and 443
// and on the URL's own port, and with wildcard every name below it. The WebSocket to the Duo
// Workflow Service goes through the instance, so it needs no rule of its own. An instance
// addressed by IP gets no wildcard.
func InstanceRules(serverURL, serverHost string, wildcard bool) ([]string, error) {
	if serverURL == "" {
		return nil, fmt.Errorf("the job JSON has no CI_SERVER_URL")
	}
	u, err := url.Parse(serverURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return nil, fmt.Errorf("CI_SERVER_URL %q is not an http(s) URL", truncate(serverURL, 200))
	}
	host := strings.ToLower(u.Hostname())
	if serverHost != "" && !strings.EqualFold(serverHost, host) {
		return nil, fmt.Errorf("CI_SERVER_HOST %q is not the host of CI_SERVER_URL %q", truncate(serverHost, 200), truncate(serverURL, 200))
	}
	addr, addrErr := netip.ParseAddr(host)
	isAddr := addrErr == nil
	if !isAddr {
		if _, err := NormalizeName(host); err != nil {
			return nil, fmt.Errorf("CI_SERVER_URL: %v", err)
		}
	}
	bracketed := host
	if isAddr && addr.Is6() {
		bracketed = "[" + host + "]"
	}
	rules := []string{bracketed + ":80", bracketed + ":443"}
	if p := u.Port(); p != "" && p != "80" && p != "443" {
		if _, err := strconv.Atoi(p); err != nil {
			return nil, fmt.Errorf("CI_SERVER_URL %q has a bad port", truncate(serverURL, 200))
		}
		rules = append(rules, net.JoinHostPort(host, p))
	}
	if wildcard && !isAddr {
		rules = append(rules, "*."+host+":80", "*."+host+":443")
	}
	if _, err := ParseAllowlist(rules); err != nil {
		return nil, fmt.Errorf("CI_SERVER_URL %q: %v", truncate(serverURL, 200), err)
	}
	return rules, nil
}
