//go:build security

package security

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
)

// TestAFailedPrepareLeavesNoGrant fails prepare after its egress grant (the state file cannot be
// saved: a directory stands where SaveJob writes it, which holds even for root, unlike a
// read-only TMPDIR) and proves that the pod, still there until cleanup, is refused what the grant
// allowed, as the proxy's admin API records; then, with a grant put back by hand, that cleanup
// without any state still withdraws it. The grant calls pass through a recorder, so the test
// also sees the grant made and withdrawn by the stages themselves.
func TestAFailedPrepareLeavesNoGrant(t *testing.T) {
	t.Parallel()
	c := clusterjobs.Connect(t)
	grants := recordGrants(t)
	r := c.NewRunnerWith(t, "sec-grant", localcluster.Config{ReadyTimeout: "5m", Pools: proxiedPools(grants.URL)})
	j := r.NewJob(t, clusterjobs.JobSpec{NoImage: true})
	if err := os.Mkdir(filepath.Join(j.Dir, "sandbox-executor-state.json.tmp"), 0o700); err != nil {
		t.Fatal(err)
	}

	prep := j.PrepareRefused(t)
	if prep.ExitCode != clusterjobs.SystemFailure || !strings.Contains(prep.Output(), "saving job state") {
		t.Fatalf("prepare exited %d, want %d for the state it could not save:\n%s", prep.ExitCode, clusterjobs.SystemFailure, prep.Output())
	}
	if j.Pod == "" {
		t.Fatalf("the failed prepare left no pod to check from: its claim has no sandbox\n%s", prep.Output())
	}
	podIP := j.PodObject(t).Status.PodIP
	calls := grants.Calls()
	t.Logf("prepare of pod %s (%s) failed as caused, with the grant calls %+v:\n%s", j.Pod, podIP, calls, prep.Output())
	put := slices.Index(calls, grantCall{http.MethodPut, podIP, http.StatusNoContent})
	if put < 0 || !slices.Contains(calls[put+1:], grantCall{http.MethodDelete, podIP, http.StatusNoContent}) {
		t.Fatalf("prepare's grant calls %+v: want a grant to %s that the proxy took (the fault after it) and its withdrawal after it", calls, podIP)
	}

	// What the user checks: the pod still runs, and the proxy refuses what the grant allowed.
	tryGranted := func() string {
		t.Helper()
		out, _ := c.Exec(context.Background(), j.Pod, "curl", "-sS", "--max-time", "20", "-x", egressProxy,
			"-w", " http=%{http_code}", "http://"+grantedDest+"/")
		return out
	}
	out := tryGranted()
	t.Logf("the pod asked the proxy for %s: %s", grantedDest, out)
	if !strings.Contains(out, "http=403") || !strings.Contains(out, "not in the allowlist") {
		t.Errorf("after the failed prepare, pod %s (%s) asked for %s through the proxy: %q; want the proxy's 403: its grant must be gone", j.Pod, podIP, grantedDest, out)
	}
	want := "GET " + grantedDest + ": " + adminclient.ReasonNotAllowed
	if blocked := blockedAttempts(t, podIP); !slices.Contains(blocked, want) {
		t.Errorf("the proxy's blocked attempts of %s are %q; want %q", podIP, blocked, want)
	}

	// A grant put back by hand, as a prepare killed between its grant and its state would leave
	// it: the positive control that the pod's request shows a live grant.
	grant := adminclient.Grant{Allow: []string{grantedDest}, Until: time.Now().Add(10 * time.Minute)}
	if err := egressAdminClient(t).PutGrant(context.Background(), podIP, grant); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = egressAdminClient(t).DeleteGrant(context.Background(), podIP) })
	if out := tryGranted(); !strings.Contains(out, "http=200") {
		t.Fatalf("positive control: with a grant, pod %s asked for %s through the proxy: %q; want 200", j.Pod, grantedDest, out)
	}

	before := len(grants.Calls())
	if _, err := os.Stat(filepath.Join(j.Dir, "sandbox-executor-state.json")); !os.IsNotExist(err) {
		t.Fatalf("prepare's state exists (%v): cleanup would not be the stateless one", err)
	}
	j.Cleanup(t)
	after := grants.Calls()[before:]
	t.Logf("stateless cleanup's grant calls: %+v", after)
	if !slices.Contains(after, grantCall{http.MethodDelete, podIP, http.StatusNoContent}) {
		t.Errorf("cleanup without a state made the grant calls %+v; want the withdrawal of %s's grant", after, podIP)
	}
}
