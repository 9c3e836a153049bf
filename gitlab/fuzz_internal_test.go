package gitlab

import (
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
