package gitlab

import (
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strings"

	"golang.org/x/net/publicsuffix"
)

// CheckInstanceWildcard refuses to grant every name below the job's instance (a pool's
// egress_instance_wildcard) when that would be a whole top-level domain or another public
// suffix, below which anyone can register names: CI_SERVER_URL https://com would grant *.com,
// https://co.uk *.co.uk, https://github.io every GitHub Pages site. A wildcard needs a host name
// of at least two labels that is not on the Public Suffix List (golang.org/x/net/publicsuffix,
// its ICANN and private sections alike); an instance addressed by IP is granted no wildcard at
// all, so it passes.
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
	if suffix, _ := publicsuffix.PublicSuffix(host); suffix == host {
		return fmt.Errorf("CI_SERVER_URL's host %q is a public suffix: egress_instance_wildcard would grant *.%s, names anyone can register; turn it off for this pool or use the instance's full name", truncate(host, 200), truncate(host, 200))
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
