package gitlab

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/net/publicsuffix"

	"github.com/sandbox-executor/sandbox-executor/egress/allowlist"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
)

// FuzzParseJob: any job JSON, however malformed, is a job within bounds or a one-line error that
// never quotes the file (it holds the job token).
func FuzzParseJob(f *testing.F) {
	f.Add([]byte(`{"id":2001,"token":"t","git_info":{"repo_url":"https://gitlab-ci-token:t@gitlab.example.com/g/p.git"},"runner_info":{"timeout":600},"variables":[{"key":"CI_SERVER_URL","value":"https://gitlab.example.com","public":true}]}`))
	f.Add([]byte(`{"id":1,"runner_info":{"timeout":9223372037}}`))
	f.Add([]byte(`{"id":1,"cache":[{"paths":["a"]}],"dependencies":[{"artifacts_file":{"filename":"x.zip"}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		job, err := parseJob("job.json", data)
		if err != nil {
			if msg := err.Error(); strings.Contains(msg, "\n") || len(data) > 8 && strings.Contains(msg, string(data)) {
				t.Fatalf("error %q is not one line, or quotes the file", msg)
			}
			if failure.KindOf(err) == failure.KindBuild {
				t.Fatalf("a bad job JSON is the job's own failure: %v", err)
			}
			return
		}
		if job.ID <= 0 || job.Timeout <= 0 || job.Timeout > MaxJobTimeout {
			t.Fatalf("accepted a job out of bounds: id %d, timeout %s", job.ID, job.Timeout)
		}
	})
}

// FuzzCheckInstanceWildcard: whatever CI_SERVER_URL a job brings, when the wildcard check
// passes and prepare grants the instance with its wildcard (allowlist.InstanceRules), that
// wildcard is below a registrable domain: never *.TLD nor *.<public suffix> (the Public Suffix
// List's ICANN and private sections). A refusal is one line.
func FuzzCheckInstanceWildcard(f *testing.F) {
	for _, u := range []string{"https://gitlab.example.com", "https://com", "https://co.uk", "https://CO.UK.", "https://github.io",
		"https://gitlab.co.uk:8443/x", "https://gitlab.example.com.", "http://10.99.1.7:8080", "https://[2001:db8::1]", "https://x.ck", "https://www.ck", "https://co%2Euk", "https://.com"} {
		f.Add(u)
	}
	f.Fuzz(func(t *testing.T, serverURL string) {
		err := (&Job{ServerURL: serverURL}).CheckInstanceWildcard()
		if err != nil {
			testutil.RequireOneLine(t, err, fmt.Sprintf("CheckInstanceWildcard(%q)", serverURL))
			return
		}
		rules, err := allowlist.InstanceRules(serverURL, "", true)
		if err != nil {
			return // prepare refuses the grant
		}
		for _, r := range rules {
			wild, ok := strings.CutPrefix(r, "*.")
			if !ok {
				continue
			}
			domain, err := allowlist.NormalizeName(wild[:strings.LastIndexByte(wild, ':')])
			if err != nil {
				t.Fatalf("the grant of %q has %q: %v", serverURL, r, err)
			}
			if !strings.Contains(domain, ".") {
				t.Fatalf("CheckInstanceWildcard passed %q, whose grant has %q: a whole top-level domain", serverURL, r)
			}
			if _, err := publicsuffix.EffectiveTLDPlusOne(domain); err != nil {
				t.Fatalf("CheckInstanceWildcard passed %q, whose grant has %q: %v", serverURL, r, err)
			}
		}
	})
}

// FuzzNonoWatch: however a stage's output is split into writes, a NonoWatch passes it through
// unchanged and hears what reading it whole, a line at a time, hears: the first complete line
// that starts with one of GitLab's nono refusals.
func FuzzNonoWatch(f *testing.F) {
	f.Add([]byte("nono found, testing Landlock sandbox capabilities...\nError: nono found but the sandbox pre-check failed, refusing to run without a sandbox\nexit\n"), uint16(60))
	f.Add([]byte("Error: nono not found on PATH (image must ship it)\r\n"), uint16(7))
	f.Add([]byte("$ echo \"Error: nono not found on PATH\"\nError: nono not found on PATH"), uint16(0))
	f.Fuzz(func(t *testing.T, output []byte, split uint16) {
		at := 0
		if len(output) > 0 {
			at = int(split) % (len(output) + 1)
		}
		var passed bytes.Buffer
		w := &NonoWatch{W: &passed}
		for _, chunk := range [][]byte{output[:at], output[at:]} {
			if n, err := w.Write(chunk); err != nil || n != len(chunk) {
				t.Fatalf("Write = %d, %v", n, err)
			}
		}
		if !bytes.Equal(passed.Bytes(), output) {
			t.Fatalf("passed %q, want %q", passed.Bytes(), output)
		}
		want := ""
		lines := bytes.Split(output, []byte("\n"))
		for _, line := range lines[:len(lines)-1] { // the last is unterminated
			for _, r := range nonoRefusals {
				if want == "" && bytes.HasPrefix(bytes.TrimRight(line, "\r"), []byte(r.line)) {
					want = r.cause
				}
			}
		}
		if w.Refused() != want {
			t.Fatalf("Refused() = %q after %q split at %d, want %q", w.Refused(), output, at, want)
		}
	})
}
