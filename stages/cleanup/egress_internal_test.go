package cleanup

import (
	"bytes"
	"context"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/egress"
	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
	"github.com/sandbox-executor/sandbox-executor/egress/allowlist"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/stages"
)

// Cleanup withdraws the pod's grant, so that a later pod with the same address cannot use it;
// a proxy that cannot be reached costs a warning, not the cleanup.
func TestRevokeEgressWithdrawsThePodsGrant(t *testing.T) {
	now := time.Date(2026, 11, 24, 5, 0, 0, 0, time.UTC)
	grants := &egress.Grants{}
	srv := httptest.NewServer(&egress.Admin{Recorder: &egress.Recorder{}, Grants: grants, Allow: egress.DefaultAdminAllow})
	defer srv.Close()
	pod := netip.MustParseAddr("10.88.0.5")
	if err := grants.Put(pod, adminclient.Grant{Allow: []string{"gitlab.example.com"}, Until: now.Add(time.Hour)}, now); err != nil {
		t.Fatal(err)
	}
	env := func(proxy string) (*stages.Env, *bytes.Buffer) {
		cfg, err := config.Parse("c.toml", []byte("namespace = \"ns\"\n[[pool]]\nname = \"duo-flow\"\negress_proxy = \""+proxy+"\"\negress_instance = true\n"))
		if err != nil {
			t.Fatal(err)
		}
		var log bytes.Buffer
		return &stages.Env{Config: cfg, Stderr: &log, Clock: testingclock.NewFakeClock(now)}, &log
	}
	saved := &kube.Sandbox{Pool: "duo-flow", Pod: "duo-flow-x", PodIP: pod.String()}
	e, log := env(srv.URL)
	e.RevokeEgress(context.Background(), saved)
	if _, ok := grants.Match(pod, allowlist.Dest{Host: "gitlab.example.com", Port: 443}, now); ok || log.Len() != 0 {
		t.Errorf("after cleanup: grant still matches %t; log %q", ok, log.String())
	}
	srv.Close()
	e, log = env(srv.URL)
	e.RevokeEgress(context.Background(), saved)
	if !strings.Contains(log.String(), "cannot withdraw the egress grant of pod duo-flow-x (10.88.0.5)") || !strings.Contains(log.String(), "it lapses when the job's time is up") {
		t.Errorf("unreachable proxy: log %q", log.String())
	}
}
