package gitlab

import (
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strings"
)

// CheckInstanceWildcard refuses to grant every name below the job's instance (a pool's
// egress_instance_wildcard) when that would be a whole top-level domain: CI_SERVER_URL
// https://com would grant *.com. A wildcard needs a host name of at least two labels; an
// instance addressed by IP is granted no wildcard at all, so it passes.
func (j *Job) CheckInstanceWildcard() error {
	u, err := url.Parse(j.ServerURL)
	if err != nil || u.Hostname() == "" {
		return fmt.Errorf("CI_SERVER_URL %q has no host", truncate(j.ServerURL, 200))
	}
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	if _, err := netip.ParseAddr(host); err == nil {
		return nil
	}
	if labels := strings.Split(host, "."); len(labels) < 2 || slices.Contains(labels, "") {
		return fmt.Errorf("CI_SERVER_URL's host %q has fewer than two labels: egress_instance_wildcard would grant *.%s; turn it off for this pool or use the instance's full name", truncate(host, 200), truncate(host, 200))
	}
	return nil
}

// truncate keeps an error about a value the job shaped to one readable line.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
