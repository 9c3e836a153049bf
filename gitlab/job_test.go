package gitlab_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/gitlab"
)

func writeJob(t *testing.T, json string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "job.json")
	if err := os.WriteFile(path, []byte(json), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestReadJobTimeout(t *testing.T) {
	for _, c := range []struct {
		runnerInfo string
		want       time.Duration
		err        string
	}{
		{``, gitlab.DefaultJobTimeout, ""},
		{`,"runner_info":{}`, gitlab.DefaultJobTimeout, ""},
		{`,"runner_info":{"timeout":600}`, 10 * time.Minute, ""},
		{`,"runner_info":{"timeout":2592000}`, gitlab.MaxJobTimeout, ""},
		// Overflowed to a negative time.Duration, which became a shutdownTime in the past.
		{`,"runner_info":{"timeout":9223372037}`, 0, "runner_info.timeout in JOB_RESPONSE_FILE is 9223372037 seconds"},
		{`,"runner_info":{"timeout":2592001}`, 0, "must be between 1 second and 2592000"},
		{`,"runner_info":{"timeout":0}`, 0, "is 0 seconds"},
		{`,"runner_info":{"timeout":-5}`, 0, "is -5 seconds"},
	} {
		job, err := gitlab.ReadJob(writeJob(t, `{"id":1,"token":"t"`+c.runnerInfo+`}`))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || failure.KindOf(err) != failure.KindPermanent || strings.Contains(err.Error(), "\n") {
				t.Errorf("%s: ReadJob = %v; want a one-line permanent error with %q", c.runnerInfo, err, c.err)
			}
			continue
		}
		if err != nil || job.Timeout != c.want {
			t.Errorf("%s: ReadJob = %+v, %v; want timeout %s", c.runnerInfo, job, err, c.want)
		}
	}
}

func TestJobFromEnvTimeout(t *testing.T) {
	env := map[string]string{"CUSTOM_ENV_CI_JOB_ID": "3"}
	for value, wantErr := range map[string]string{"": "", "600": "", "9223372037": "is 9223372037 seconds", "-1": "is -1 seconds", "soon": "is not a number"} {
		env["CUSTOM_ENV_CI_JOB_TIMEOUT"] = value
		_, err := gitlab.JobFromEnv(func(k string) string { return env[k] })
		if (wantErr == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), wantErr) {
			t.Errorf("CUSTOM_ENV_CI_JOB_TIMEOUT=%q: %v; want %q", value, err, wantErr)
		}
	}
}

// GitLab lists its predefined variables before every user-defined one, so the first
// CI_SERVER_URL is the instance's; a job's own CI_SERVER_URL, later, must not move its grant.
func TestReadJobTakesTheInstanceGitLabListsFirst(t *testing.T) {
	job, err := gitlab.ReadJob(writeJob(t, `{"id":1,"token":"t","variables":[
		{"key":"CI_SERVER_URL","value":"https://gitlab.example.com","public":true},
		{"key":"CI_SERVER_HOST","value":"gitlab.example.com","public":true},
		{"key":"CI_SERVER_URL","value":"https://evil.example","public":true},
		{"key":"CI_SERVER_HOST","value":"evil.example","public":false}]}`))
	if err != nil || job.ServerURL != "https://gitlab.example.com" || job.ServerHost != "gitlab.example.com" {
		t.Fatalf("ReadJob = %+v, %v; want the first CI_SERVER_URL and CI_SERVER_HOST", job, err)
	}
}

func TestCheckInstanceWildcard(t *testing.T) {
	for url, wantErr := range map[string]string{
		"https://gitlab.example.com":       "",
		"https://example.com:8443/path":    "",
		"http://10.99.1.7:8080":            "",
		"https://[2001:db8::1]":            "",
		"https://com":                      `"com" has fewer than two labels: egress_instance_wildcard would grant *.com`,
		"https://com.":                     "fewer than two labels",
		"http://gitlab":                    "fewer than two labels",
		"https://.com":                     "fewer than two labels",
		"https://co.uk":                    `"co.uk" is a public suffix: egress_instance_wildcard would grant *.co.uk`,
		"https://CO.UK.":                   `"co.uk" is a public suffix`,
		"https://github.io":                `"github.io" is a public suffix`,
		"https://s3.amazonaws.com":         `"s3.amazonaws.com" is a public suffix`,
		"https://gitlab.co.uk":             "",
		"https://gitlab.example.github.io": "",
		"":                                 "has no host",
		"not a url":                        "has no host",
	} {
		err := (&gitlab.Job{ServerURL: url}).CheckInstanceWildcard()
		if (wantErr == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), wantErr) {
			t.Errorf("CheckInstanceWildcard(%q) = %v; want %q", url, err, wantErr)
		}
	}
}
