package clusterjobs

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
)

// A cluster is whole when every component answers (tests/cluster/check.sh --no-pods: daemons,
// the API, the warm pool) and NetworkPolicy is enforced on new pods (tests/cluster/netpol-check.sh
// --enforcement: a new gVisor pod of the ci image starts, resolves cluster names, passes its
// positive controls, and a deny-all egress policy takes effect on it; the node's forward guard
// holds). That proves enforcement is on; what NetworkPolicy means (ingress, ipBlock allows,
// removals) is `make netpol`'s full run, once per `make check`, and does not change with a
// component's restart, so the checks here skip it: they run before every suite and after every
// break, 9 times per check. For the same reason the one pod stands in for check.sh's three (a
// gVisor pod per local image and a runc pod, whose images and runtime no break changes), which
// `make cluster-up` still starts once per check: a pod costs the node about 12 CPU-seconds.
// Suites check it before their first test, and a test that stops or kills a component waits for
// it before it returns, so suites can run in any order and no test inherits a half-broken cluster
// (a fence that does not hold yet, say).

// Between check.sh runs the cluster gets a few seconds to settle.
const checkInterval = 5 * time.Second

// checkArgs are check.sh's: its pods are left to netpol-check.sh --enforcement's.
var checkArgs = []string{"--no-pods"}

// enforcementWait is how long netpol-check.sh waits for each policy change to take effect
// after a component restart: kube-router resyncs its pod sets only once its watches are back.
const enforcementWait = "90"

// CheckWhole runs check.sh once and, if that passes, proves NetworkPolicy enforcement; the
// error quotes the failing check's output.
func CheckWhole(ctx context.Context) error {
	if out, err := ClusterScript(ctx, "check.sh", nil, checkArgs...); err != nil {
		return fmt.Errorf("tests/cluster/check.sh --no-pods: %v\n%s", err, out)
	}
	return proveEnforcement(ctx)
}

// proveEnforcement runs netpol-check.sh --enforcement: a deny denies on a new pod, next to its
// positive controls.
func proveEnforcement(ctx context.Context) error {
	if out, err := ClusterScript(ctx, "netpol-check.sh", []string{"NETPOL_CHECK_WAIT=" + enforcementWait}, "--enforcement"); err != nil {
		return fmt.Errorf("NetworkPolicy is not enforced (tests/cluster/netpol-check.sh): %v\n%s", err, out)
	}
	return nil
}

// WaitWhole waits, up to timeout, until the components answer again, then proves NetworkPolicy
// enforcement once. It is for after a deliberate break: components take a while to come back,
// but enforcement is proven, not retried until it happens to pass.
func WaitWhole(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last string
	err := wait.PollUntilContextCancel(ctx, checkInterval, true, func(ctx context.Context) (bool, error) {
		out, err := ClusterScript(ctx, "check.sh", nil, checkArgs...)
		last = out
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("the cluster is not whole %s after the break (tests/cluster/check.sh --no-pods):\n%s", timeout, last)
	}
	return proveEnforcement(ctx)
}

// RestoreAfterBreak registers, before a test breaks a component, the restart of that component
// (start, which must be idempotent) and the wait until the cluster is whole again. A cluster
// that does not come back fails the test that broke it.
func RestoreAfterBreak(t testing.TB, start func() error) {
	t.Helper()
	t.Cleanup(func() {
		if err := start(); err != nil {
			t.Errorf("restoring the cluster: %v", err)
		}
		begun := time.Now()
		if err := WaitWhole(context.Background(), 5*time.Minute); err != nil {
			t.Error(err)
			return
		}
		t.Logf("cluster whole again, NetworkPolicy enforced, %s after the test", time.Since(begun).Round(time.Second))
	})
}

// scriptTimeout bounds RunScript: a component's start waits until it is usable.
const scriptTimeout = 5 * time.Minute

// RunScript runs tests/cluster/NAME with args, to break or restore a component; the error quotes
// the script's output.
func RunScript(name string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), scriptTimeout)
	defer cancel()
	if out, err := ClusterScript(ctx, name, nil, args...); err != nil {
		return fmt.Errorf("tests/cluster/%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// ClusterScript runs tests/cluster/NAME with args and variables added to its environment (ctx
// bounds it); the output is stdout and stderr together.
func ClusterScript(ctx context.Context, name string, env []string, args ...string) (string, error) {
	root, err := testutil.ModuleRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(root, "tests", "cluster", name), args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// SuiteMain is the TestMain of a suite that runs on the local cluster: it refuses to start on a
// cluster that is not whole (one line naming what is missing, exit 1), so no test fails for a
// reason an earlier suite or a half-done `make cluster-up` left behind.
func SuiteMain(m *testing.M, suite string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	err := CheckWhole(ctx)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: the local cluster is not whole (make cluster-up, then make netpol): %v\n", suite, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}
