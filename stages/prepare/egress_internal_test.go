package prepare

import (
	"bytes"
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/egress"
	"github.com/sandbox-executor/sandbox-executor/egress/allowlist"
	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/gitlab"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/stages"
)

// releases records the claims prepare releases; the rest of stages.Cluster is not called.
type releases struct {
	stages.Cluster
	claims []string
}

func (r *releases) Release(_ context.Context, _, claim, _ string, _ kube.Outcome) error {
	r.claims = append(r.claims, claim)
	return nil
}

func (r *releases) Exec() kube.RemoteExecutor { return nil }

var now = time.Date(2026, 11, 24, 5, 0, 0, 0, time.UTC)

// grantStand is a pool whose egress proxy's admin endpoint is a real one on loopback.
func grantStand(t *testing.T, poolKeys string) (*stages.Env, *bytes.Buffer, *egress.Grants, *egress.Admin) {
	t.Helper()
	grants := &egress.Grants{}
	admin := &egress.Admin{Recorder: &egress.Recorder{}, Grants: grants, Allow: egress.DefaultAdminAllow, Now: func() time.Time { return now }}
	srv := httptest.NewServer(admin)
	t.Cleanup(srv.Close)
	cfg, err := config.Parse("c.toml", []byte("namespace = \"ns\"\nclaim_grace = \"15m\"\n[[pool]]\nname = \"duo-flow\"\negress_proxy = \""+srv.URL+"\"\n"+poolKeys))
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	return &stages.Env{Config: cfg, Stderr: &log, Clock: testingclock.NewFakeClock(now)}, &log, grants, admin
}

var flowSandbox = &kube.Sandbox{Namespace: "ns", Claim: "job-7-abc", Pool: "duo-flow", Pod: "duo-flow-x", PodIP: "10.88.0.5"}

func TestGrantEgressGivesThePodItsJobsInstanceUntilTheJobsDeadline(t *testing.T) {
	env, log, grants, _ := grantStand(t, "egress_instance = true\negress_instance_wildcard = true\negress_allow = [\"registry.npmjs.org:443\"]\n")
	job := &gitlab.Job{ID: 7, Timeout: time.Hour, ServerURL: "https://gitlab.example.com", ServerHost: "gitlab.example.com"}
	cluster := &releases{}
	if err := grantEgress(context.Background(), env, cluster, job, flowSandbox, "b"); err != nil {
		t.Fatal(err)
	}
	pod := netip.MustParseAddr("10.88.0.5")
	for _, c := range []struct {
		dest    allowlist.Dest
		at      time.Time
		allowed bool
	}{
		{allowlist.Dest{Host: "gitlab.example.com", Port: 443}, now, true},
		{allowlist.Dest{Host: "ws.gitlab.example.com", Port: 443}, now, true},
		{allowlist.Dest{Host: "registry.npmjs.org", Port: 443}, now, true},
		{allowlist.Dest{Host: "evil.example", Port: 443}, now, false},
		{allowlist.Dest{Host: "gitlab.example.com", Port: 22}, now, false},
		// The claim's shutdownTime: job timeout + claim_grace.
		{allowlist.Dest{Host: "gitlab.example.com", Port: 443}, now.Add(time.Hour + 15*time.Minute - time.Second), true},
		{allowlist.Dest{Host: "gitlab.example.com", Port: 443}, now.Add(time.Hour + 15*time.Minute), false},
	} {
		if _, ok := grants.Match(pod, c.dest, c.at); ok != c.allowed {
			t.Errorf("%s at +%s: allowed %t, want %t", c.dest, c.at.Sub(now), ok, c.allowed)
		}
	}
	if _, ok := grants.Match(netip.MustParseAddr("10.88.0.6"), allowlist.Dest{Host: "gitlab.example.com", Port: 443}, now); ok {
		t.Error("another pod got the grant")
	}
	want := "Egress of this job through the egress proxy of pool duo-flow: gitlab.example.com:80, gitlab.example.com:443, *.gitlab.example.com:80, *.gitlab.example.com:443, registry.npmjs.org:443 (until the job ends)"
	if !strings.Contains(log.String(), want) || len(cluster.claims) != 0 {
		t.Errorf("job log %q (released %v), want %q", log.String(), cluster.claims, want)
	}
}

func TestGrantEgressFailuresReleaseTheSandbox(t *testing.T) {
	for _, c := range []struct {
		name, poolKeys, serverURL string
		untrusted                 bool
		kind                      failure.Kind
		want                      string
	}{
		{"no instance in the job JSON", "egress_instance = true\n", "", false, failure.KindPermanent,
			"pool duo-flow grants each job its GitLab instance (egress_instance), but the job JSON has no CI_SERVER_URL"},
		{"a one-label instance with the wildcard", "egress_instance = true\negress_instance_wildcard = true\n", "https://com", false, failure.KindPermanent,
			"fewer than two labels: egress_instance_wildcard would grant *.com"},
		{"a bad allow entry", "egress_allow = [\"a.*.example\"]\n", "https://gitlab.example.com", false, failure.KindSystem,
			"refused the job's egress grant: 400 Bad Request: egress proxy admin: grant refused"},
		{"a proxy that does not trust the runner", "egress_instance = true\n", "https://gitlab.example.com", true, failure.KindSystem,
			"refused the job's egress grant: 403 Forbidden"},
	} {
		t.Run(c.name, func(t *testing.T) {
			env, _, _, admin := grantStand(t, c.poolKeys)
			if c.untrusted {
				admin.Allow = nil
			}
			cluster := &releases{}
			err := grantEgress(context.Background(), env, cluster, &gitlab.Job{ID: 7, Timeout: time.Hour, ServerURL: c.serverURL}, flowSandbox, "b")
			if err == nil || failure.KindOf(err) != c.kind || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("grantEgress = %v (kind %v), want a %v error containing %q", err, failure.KindOf(err), c.kind, c.want)
			}
			if len(cluster.claims) != 1 || cluster.claims[0] != "job-7-abc" {
				t.Errorf("released %v, want the job's claim", cluster.claims)
			}
		})
	}
}

func TestGrantEgressIsNothingForPoolsWithoutGrants(t *testing.T) {
	env, log, _, _ := grantStand(t, "")
	if err := grantEgress(context.Background(), env, &releases{}, &gitlab.Job{ID: 7}, flowSandbox, "b"); err != nil || log.Len() != 0 {
		t.Errorf("grantEgress = %v, log %q", err, log.String())
	}
}

// A prepare that fails after the grant (here: its state cannot be saved) withdraws it: cleanup
// finds no state then, and the grant would outlive the pod, for the next pod of its address.
func TestAFailureAfterTheGrantWithdrawsIt(t *testing.T) {
	env, log, grants, _ := grantStand(t, "egress_instance = true\n")
	env.Runner.TmpDir = filepath.Join(t.TempDir(), "not-a-directory")
	if err := os.WriteFile(env.Runner.TmpDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	job := &gitlab.Job{ID: 7, Timeout: time.Hour, ServerURL: "https://gitlab.example.com"}
	p := &preparation{env: env, cluster: &releases{}, job: job, req: kube.ClaimRequest{Binding: "b"}, start: now}
	if err := p.grantAndKeep(context.Background(), flowSandbox, executor.Transport{}, 0); err == nil || !strings.Contains(err.Error(), "saving job state") {
		t.Fatalf("grantAndKeep = %v, want the state's error", err)
	}
	if _, ok := grants.Match(netip.MustParseAddr(flowSandbox.PodIP), allowlist.Dest{Host: "gitlab.example.com", Port: 443}, now); ok {
		t.Errorf("the grant outlived the failed prepare; job log %q", log.String())
	}
}

// A grant call without an answer may have been made: it is withdrawn before prepare fails. A
// refusal made nothing and is not.
func TestAGrantWithoutAnAnswerIsWithdrawn(t *testing.T) {
	env, _, grants, admin := grantStand(t, "egress_instance = true\n")
	pod := netip.MustParseAddr(flowSandbox.PodIP)
	// The proxy takes the grant, then the answer is lost: the stage's call times out.
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		admin.ServeHTTP(httptest.NewRecorder(), r)
		if r.Method == http.MethodPut {
			<-r.Context().Done()
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer slow.Close()
	env.Config.Pools[0].EgressProxy = slow.URL
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	job := &gitlab.Job{ID: 7, Timeout: time.Hour, ServerURL: "https://gitlab.example.com"}
	if err := grantEgress(ctx, env, &releases{}, job, flowSandbox, "b"); err == nil {
		t.Fatal("grantEgress succeeded without an answer")
	}
	if _, ok := grants.Match(pod, allowlist.Dest{Host: "gitlab.example.com", Port: 443}, now); ok {
		t.Error("a grant the proxy took without answering outlived the failed prepare")
	}
}

// With egress_admin_token_file, the grant carries the token the proxy wants from the runners.
func TestGrantEgressSendsTheAdminToken(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("a-token-of-32-characters-or-so!!\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env, _, grants, admin := grantStand(t, "egress_instance = true\n")
	env.Config.EgressAdminTokenFile = tokenFile
	guarded := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer a-token-of-32-characters-or-so!!" {
			http.Error(w, "no token", http.StatusForbidden)
			return
		}
		admin.ServeHTTP(w, r)
	}))
	defer guarded.Close()
	env.Config.Pools[0].EgressProxy = guarded.URL
	job := &gitlab.Job{ID: 7, Timeout: time.Hour, ServerURL: "https://gitlab.example.com"}
	if err := grantEgress(context.Background(), env, &releases{}, job, flowSandbox, "b"); err != nil {
		t.Fatal(err)
	}
	if _, ok := grants.Match(netip.MustParseAddr(flowSandbox.PodIP), allowlist.Dest{Host: "gitlab.example.com", Port: 443}, now); !ok {
		t.Error("no grant")
	}
}

// An https egress_proxy is verified with egress_admin_ca_file: the grant goes through to the
// proxy whose CA it names, and a proxy of another CA gets nothing, the token included.
func TestGrantEgressVerifiesTheProxyWithTheAdminCA(t *testing.T) {
	dir := t.TempDir()
	tokenFile, caFile := filepath.Join(dir, "token"), filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(tokenFile, []byte("a-token-of-32-characters-or-so!!\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env, _, grants, admin := grantStand(t, "egress_instance = true\n")
	env.Config.EgressAdminTokenFile = tokenFile
	var tokens []string
	proxy := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tokens = append(tokens, r.Header.Get("Authorization"))
		admin.ServeHTTP(w, r)
	}))
	defer proxy.Close()
	env.Config.Pools[0].EgressProxy = proxy.URL
	job := &gitlab.Job{ID: 7, Timeout: time.Hour, ServerURL: "https://gitlab.example.com"}

	// Without the CA (the system's roots), the test server's certificate is unknown.
	if err := grantEgress(context.Background(), env, &releases{}, job, flowSandbox, "b"); err == nil || len(tokens) != 0 {
		t.Fatalf("a grant to a proxy no configured CA signed: %v, %d requests; want a refusal before any", err, len(tokens))
	}
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: proxy.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	env.Config.EgressAdminCAFile = caFile
	if err := grantEgress(context.Background(), env, &releases{}, job, flowSandbox, "b"); err != nil {
		t.Fatal(err)
	}
	if _, ok := grants.Match(netip.MustParseAddr(flowSandbox.PodIP), allowlist.Dest{Host: "gitlab.example.com", Port: 443}, now); !ok || len(tokens) != 1 || tokens[0] != "Bearer a-token-of-32-characters-or-so!!" {
		t.Errorf("grant over TLS: granted %v, tokens %q", ok, tokens)
	}
}
