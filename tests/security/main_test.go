//go:build security

// Package security runs jobs that try to break out of their sandbox on the real local cluster
// (make cluster-up), through our binary's stages as a runner calls them, and asserts that every
// attempt fails. Each test names its expectation. Run it with `make security`.
package security

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
)

// The local cluster's addresses (tests/cluster: net.sh, networkpolicy.sh).
func TestMain(m *testing.M) { clusterjobs.SuiteMain(m, "security") }

const (
	nodeIP     = "10.77.0.1"
	podGateway = "10.88.0.1"
	podBridge  = "sbx-pods0"
	internet   = "10.99.0.2" // "the internet": not in the template's egress allowlist
	gitlab     = "10.99.1.2" // "the GitLab instance": allowed on TCP 80 and 443
	gitlabAlt  = 9090        // a port of the GitLab instance the allowlist does not open
	metadataIP = "169.254.169.254"
	clusterDNS = "10.96.0.10" // the kube-dns Service (tests/cluster/dns.sh)
	// kubernetesService is the kubernetes Service's ClusterIP, routed by kube-proxy.
	kubernetesService = "10.96.0.1"
)

// prepared is a job of the default pool that is ready to run stages.
func prepared(t *testing.T, r *clusterjobs.Runner, spec clusterjobs.JobSpec) *clusterjobs.Job {
	t.Helper()
	j := r.NewJob(t, spec)
	j.Prepare(t)
	return j
}

// probeLib is shell that tries connections from inside a job. `probe NAME CURL-ARGS...` runs curl
// in the background; `probes` waits for all and prints one "@probe NAME rc=CODE OUTPUT" line
// each. Blocked traffic is dropped, so a probe takes up to its connect timeout: running them
// together keeps a job's probes within that once.
const probeLib = `
mkdir -p /tmp/probes
probe() {
  name=$1; shift
  ( out=$(curl -gksS --connect-timeout 3 --max-time 5 "$@" 2>&1); rc=$?
    printf '@probe %s rc=%s %s\n' "$name" "$rc" "$(printf %s "$out" | tr '\n' ' ' | cut -c1-200)" >/tmp/probes/$name ) &
}
probes() { wait; cat /tmp/probes/*; rm -rf /tmp/probes; }
`

type probeResult struct {
	rc  int
	out string
}

var probeLine = regexp.MustCompile(`(?m)^@probe (\S+) rc=(\d+) ?(.*)$`)

// probeResults parses the "@probe" lines of a stage's output.
func probeResults(t *testing.T, output string) map[string]probeResult {
	t.Helper()
	res := map[string]probeResult{}
	for _, m := range probeLine.FindAllStringSubmatch(output, -1) {
		rc, _ := strconv.Atoi(m[2])
		res[m[1]] = probeResult{rc, m[3]}
	}
	return res
}

// reachable asserts that a probe got the expected answer. It is the positive control that makes
// the blocked checks next to it mean something: the same tool, from the same pod, works.
func reachable(t *testing.T, res map[string]probeResult, name, want string) bool {
	t.Helper()
	p, ok := res[name]
	switch {
	case !ok:
		t.Errorf("probe %s did not run", name)
	case p.rc != 0 || !strings.Contains(p.out, want):
		t.Errorf("positive control %s: curl exit %d, %q; want an answer containing %q", name, p.rc, p.out, want)
	default:
		t.Logf("reachable as expected: %s (%s)", name, p.out)
		return true
	}
	return false
}

// blocked asserts that a probe failed to connect at all.
func blocked(t *testing.T, res map[string]probeResult, name string) {
	t.Helper()
	p, ok := res[name]
	switch {
	case !ok:
		t.Errorf("probe %s did not run", name)
	case p.rc == 0:
		t.Errorf("%s is REACHABLE from a job: %q", name, p.out)
	// 6 could not resolve, 7 could not connect, 28 timeout: no connection. Anything else (an
	// HTTP or TLS error) means a connection was made.
	case p.rc != 6 && p.rc != 7 && p.rc != 28:
		t.Errorf("%s: curl exit %d (%s) means the job got a connection", name, p.rc, p.out)
	default:
		t.Logf("blocked as expected: %s (curl exit %d: %s)", name, p.rc, p.out)
	}
}

// mustControls stops the test when a positive control failed: the blocked checks would pass for
// a broken probe.
func mustControls(t *testing.T, ok ...bool) {
	t.Helper()
	for _, o := range ok {
		if !o {
			t.Fatal("a positive control failed: the blocked checks below would prove nothing")
		}
	}
}

func url(host string, port int, path string) string {
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return fmt.Sprintf("http://%s:%d%s", host, port, path)
}

func httpsURL(host string, port int, path string) string {
	return "https" + strings.TrimPrefix(url(host, port, path), "http")
}
