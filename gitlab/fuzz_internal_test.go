package gitlab

import (
	"strings"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/failure"
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
