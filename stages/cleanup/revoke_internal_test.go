package cleanup

import (
	"bytes"
	"context"
	"errors"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/egress"
	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
	"github.com/sandbox-executor/sandbox-executor/egress/allowlist"
	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/gitlab"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/stages"
)

// claimOnly is a cluster that holds the job's claim and fails or not to release it.
type claimOnly struct {
	stages.Cluster
	sandbox    *kube.Sandbox
	releaseErr error
	released   int
}

func (c *claimOnly) Find(context.Context, string, string, string, []string) (*kube.Sandbox, error) {
	if c.sandbox == nil {
		return nil, errors.New("Find called although prepare saved the sandbox")
	}
	return c.sandbox, nil
}

func (c *claimOnly) Release(context.Context, string, string, string, kube.Outcome) error {
	c.released++
	return c.releaseErr
}

// Cleanup withdraws the pod's grant whenever it can name the pod: from prepare's state, or
// without one (prepare failed after the grant) from the claim; and also when the release fails.
func TestCleanupWithdrawsTheGrantOnEveryPath(t *testing.T) {
	now := time.Date(2026, 11, 24, 5, 0, 0, 0, time.UTC)
	pod := netip.MustParseAddr("10.88.0.5")
	sbx := &kube.Sandbox{Namespace: "ns", Claim: kube.ClaimName("glcbt-token", "r", 7), Pool: "duo-flow", Pod: "duo-flow-x", PodIP: pod.String()}
	instance := allowlist.Dest{Host: "gitlab.example.com", Port: 443}
	for _, tc := range []struct {
		name       string
		saved      bool
		releaseErr error
	}{
		{"prepare saved no state", false, nil},
		{"the release fails", true, errors.New("API server gone")},
		{"no state and the release fails", false, errors.New("API server gone")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			grants := &egress.Grants{}
			srv := httptest.NewServer(&egress.Admin{Recorder: &egress.Recorder{}, Grants: grants, Allow: egress.DefaultAdminAllow})
			defer srv.Close()
			if err := grants.Put(pod, adminclient.Grant{Allow: []string{"gitlab.example.com"}, Until: now.Add(time.Hour)}, now); err != nil {
				t.Fatal(err)
			}
			cfg, err := config.Parse("c.toml", []byte("namespace = \"ns\"\nrunner_name = \"r\"\n[[pool]]\nname = \"duo-flow\"\negress_proxy = \""+srv.URL+"\"\negress_instance = true\n"))
			if err != nil {
				t.Fatal(err)
			}
			var log bytes.Buffer
			env := &stages.Env{Config: cfg, Stderr: &log, Clock: testingclock.NewFakeClock(now), Runner: gitlab.RunnerEnv{TmpDir: t.TempDir()}}
			job := &gitlab.Job{ID: 7, Token: "glcbt-token"}
			if tc.saved {
				if err := executor.SaveJob(env.Runner.TmpDir, &executor.JobState{Sandbox: sbx}); err != nil {
					t.Fatal(err)
				}
			}
			cluster := &claimOnly{releaseErr: tc.releaseErr}
			if !tc.saved {
				cluster.sandbox = sbx
			}
			err = releaseJob(context.Background(), env, cluster, job)
			if !errors.Is(err, tc.releaseErr) || cluster.released != 1 {
				t.Errorf("releaseJob = %v after %d releases, want %v after 1", err, cluster.released, tc.releaseErr)
			}
			if _, ok := grants.Match(pod, instance, now); ok {
				t.Errorf("the grant outlived cleanup; log %q", log.String())
			}
		})
	}
}
