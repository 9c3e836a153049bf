package agent

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/agentca"
)

// FuzzRecordedDigest: the helper's recorded sha256 is taken exactly when the file holds 64
// lowercase hex digits, with or without one newline, and is then those digits; anything else
// (longer, shorter, uppercase, another byte) makes the agent hash the helper itself.
func FuzzRecordedDigest(f *testing.F) {
	f.Add([]byte(strings.Repeat("0123456789abcdef", 4) + "\n"))
	f.Add([]byte(strings.Repeat("0123456789abcdef", 4)))
	f.Add([]byte(strings.Repeat("0123456789ABCDEF", 4)))
	f.Add([]byte(strings.Repeat("a", 64) + "\n\n"))
	f.Add([]byte(strings.Repeat("a", 63) + "\n"))
	f.Add([]byte(strings.Repeat("a", 64) + "\r\n"))
	exact := regexp.MustCompile(`\A[0-9a-f]{64}\n?\z`)
	path := filepath.Join(f.TempDir(), "helper"+wire.HelperDigestSuffix) // one file per process: its runs take turns
	f.Fuzz(func(t *testing.T, content []byte) {
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		digest, ok := recordedDigest(path)
		if want := exact.Match(content); ok != want {
			t.Fatalf("recordedDigest(%q) = %q, %t; want ok %t", content, digest, ok, want)
		}
		if ok && digest != strings.TrimSuffix(string(content), "\n") || !ok && digest != "" {
			t.Fatalf("recordedDigest(%q) = %q, %t", content, digest, ok)
		}
	})
}

// FuzzJobOf: the job the agent reads from a client certificate is the job the executor's CA
// signed it for (agentca.ClientConfig, through DER and back), whatever the binding; and of a
// certificate with other URIs, it is the first URI that names a job, never an empty job.
func FuzzJobOf(f *testing.F) {
	ca, err := agentca.New("fuzz", time.Hour)
	if err != nil {
		f.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	spki, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		f.Fatal(err)
	}
	identity := wire.IdentityOf(spki)
	f.Add("3f1c9a0e5b7d2c4a6e8f0b1d3c5a7e9f", "https://example.com/x")
	f.Add("a b", wire.JobURIPrefix)
	f.Add("j#frag?q=1", wire.JobURIPrefix+"other")
	f.Add("%41%zz", "urn:sandbox-executor:JOB:x")
	f.Add("", wire.JobURIPrefix+"x\n")
	f.Fuzz(func(t *testing.T, job, other string) {
		if cfg, err := ca.ClientConfig(job, identity); err == nil { // else the executor refuses the job
			leaf, err := x509.ParseCertificate(cfg.Certificates[0].Certificate[0])
			if err != nil {
				t.Fatalf("the client certificate for job %q does not parse: %v", job, err)
			}
			if got, err := jobOf(tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}}); err != nil || got != job {
				t.Fatalf("a certificate signed for job %q is read as %q, %v", job, got, err)
			}
		}

		var uris []*url.URL
		for _, s := range strings.Split(other, "\n") {
			if u, err := url.Parse(s); err == nil {
				uris = append(uris, u)
			}
		}
		got, err := jobOf(tls.ConnectionState{PeerCertificates: []*x509.Certificate{{URIs: uris}}})
		var want string
		for _, u := range uris {
			if j, ok := strings.CutPrefix(u.String(), wire.JobURIPrefix); ok && j != "" {
				want = j
				break
			}
		}
		if got != want || (err == nil) != (want != "") || err != nil && strings.Contains(err.Error(), "\n") {
			t.Fatalf("jobOf(URIs %q) = %q, %v; want %q", other, got, err, want)
		}
	})
}

// FuzzFenceFromEnv: a fence configuration is read as given or reported: a valid one lists every
// comma-separated entry, trimmed, each a host:port, and a timeout from 10ms to 5s; an invalid
// one is a one-line problem, and a fence that names anything at all, valid or not, is
// configured, so that the pod's check never passes a fence it cannot check.
func FuzzFenceFromEnv(f *testing.F) {
	f.Add("10.96.0.1:443, 169.254.169.254:80", "gitlab.example.com:443", "")
	f.Add("[fd00::1]:443,,", "", "500ms")
	f.Add("no-port", "x:", "10s")
	f.Add("10.0.0.1:80,no-port", "", "")
	f.Add(" , ", "", "1ns")
	f.Add("", "", "5s")
	f.Fuzz(func(t *testing.T, deny, allow, timeout string) {
		env := map[string]string{wire.FenceDenyEnv: deny, wire.FenceAllowEnv: allow, wire.FenceTimeoutEnv: timeout}
		fence := FenceFromEnv(func(k string) string { return env[k] })
		names := func(list string) int {
			n := 0
			for _, a := range strings.Split(list, ",") {
				if strings.TrimSpace(a) != "" {
					n++
				}
			}
			return n
		}
		if names(deny)+names(allow) > 0 && !fence.Configured() {
			t.Fatalf("FenceFromEnv(%q, %q) names addresses but is not configured", deny, allow)
		}
		if fence.invalid != "" {
			if !fence.Configured() || strings.Contains(fence.invalid, "\n") {
				t.Fatalf("FenceFromEnv(%q, %q, %q): problem %q, configured %t", deny, allow, timeout, fence.invalid, fence.Configured())
			}
			if report := fence.Check(); !report.Configured || len(report.Problems) == 0 {
				t.Fatalf("FenceFromEnv(%q, %q, %q) is invalid (%s) yet its check reports %+v", deny, allow, timeout, fence.invalid, report)
			}
			return
		}
		if len(fence.Deny) != names(deny) || len(fence.Allow) != names(allow) {
			t.Fatalf("FenceFromEnv(%q, %q) = deny %q, allow %q: not every entry", deny, allow, fence.Deny, fence.Allow)
		}
		for _, a := range append(fence.Deny, fence.Allow...) {
			if _, port, err := net.SplitHostPort(a); err != nil || port == "" || a != strings.TrimSpace(a) {
				t.Fatalf("FenceFromEnv(%q, %q) has %q: not a trimmed host:port", deny, allow, a)
			}
		}
		if fence.Timeout < 10*time.Millisecond || fence.Timeout > 5*time.Second || timeout == "" && fence.Timeout != wire.FenceTimeout {
			t.Fatalf("FenceFromEnv(timeout %q) = %s", timeout, fence.Timeout)
		}
	})
}
