package app_test

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/egress"
)

// A runner that dies never runs cleanup, so it never withdraws its jobs' egress grants: gc,
// reaping such a job's claim, withdraws the grant of the claim's pod as well.
func TestGCWithdrawsTheGrantOfAClaimItReaps(t *testing.T) {
	grants := &egress.Grants{}
	srv := httptest.NewServer(&egress.Admin{Recorder: &egress.Recorder{}, Grants: grants, Allow: egress.DefaultAdminAllow})
	defer srv.Close()
	h := newHarnessWithPool(t, "ci:bookworm", "", `images = ["ci:bookworm"]
egress_proxy = "`+srv.URL+`"
egress_allow = ["registry.npmjs.org:443"]`)
	if code, out, errOut := h.run("prepare"); code != 0 {
		t.Fatalf("prepare: exit %d\n%s%s", code, out, errOut)
	}
	if live := grants.Live(time.Now()); len(live) != 1 {
		t.Fatalf("after prepare: grants %+v, want the job pod's", live)
	}
	// The runner died here: no cleanup. Its claim is reaped as soon as it is older than 1 ns.
	code, out, errOut := h.run("gc", "--delete", "--older-than", "1ns")
	if code != 0 || !strings.Contains(out, "deleted ") {
		t.Fatalf("gc --delete: exit %d\n%s%s", code, out, errOut)
	}
	if live := grants.Live(time.Now()); len(live) != 0 {
		t.Errorf("after gc reaped the job's claim: grants %+v, want none\n%s%s", live, out, errOut)
	}
}
