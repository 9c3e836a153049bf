//go:build amd64 || arm64

package netfence

import (
	"errors"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// The Linux kernel is a runtime that refuses both: a user namespace's CAP_NET_RAW does not reach
// the network namespace its parent owns, and IPT_SO_SET_REPLACE checks CAP_NET_ADMIN first. So
// the real probes, run as the verb runs them (this binary re-executed: TestMain), must prove it:
// every socket and replace EPERM. They run from a network namespace of their own, so that even a
// probe that went wrong could reach no table of the host's.
func TestProveRuntimeProvesTheLinuxKernel(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: the replace probe needs a raw socket")
	}
	userns := exec.Command(os.Args[0], "-test.run=^$")
	userns.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER}
	if out, err := userns.CombinedOutput(); err != nil {
		t.Skipf("this host makes no user namespace: %v: %s", err, out)
	}
	ns := newNetns(t)
	var report probeReport
	var err error
	ns.Do(func() {
		report = runtimeProbes()
		err = ProveRuntime()
	})
	want := concat(refusedSockets, refusedReplace)
	if !slices.Equal(report.Results, want) || len(report.Unproven) > 0 || err != nil {
		t.Errorf("the probes on Linux: %+v, unproven %q: ProveRuntime = %v\nwant %+v, each EPERM", report.Results, report.Unproven, err, want)
	}
}

// The same probes, made without what makes them probes, are answers of a runtime that grants:
// sockets asked for in the initial user namespace by root, which holds CAP_NET_RAW where the
// network namespace's owner is; a replace from a thread that keeps CAP_NET_ADMIN, which Linux
// lets past its check to the table's unknown name (EINVAL). ProveRuntime must fail on them, so
// that it would on a runtime that answers a job so.
func TestProbesTellARuntimeThatGrants(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: the probes need CAP_NET_RAW and CAP_NET_ADMIN")
	}
	ns := newNetns(t)
	var sockets, replaces []probeResult
	var err error
	ns.Do(func() {
		sockets = socketProbes()
		replaces, err = replaceProbes(false)
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := concat(grantedSockets, grantedReplace); !slices.Equal(concat(sockets, replaces), want) {
		t.Fatalf("the probes with the capabilities: %+v, want %+v", concat(sockets, replaces), want)
	}
	withProbes(t, probeReport{Results: concat(sockets, replaces)})
	err = ProveRuntime()
	var re *RuntimeError
	if !errors.As(err, &re) || len(re.Granted) != 3 || len(re.Unproven) != 0 || !strings.Contains(err.Error(), MinRunsc) {
		t.Errorf("ProveRuntime on answers that grant: %v; want the sockets and both replaces granted, naming %s", err, MinRunsc)
	}
}

// A probe child that cannot be what it must, says so, and ProveRuntime fails closed: on Linux,
// no thread of a process of many threads may unshare its user namespace (EINVAL), and a child
// started in the initial user namespace is not in a new one.
func TestProbeChildFailsClosedWhenItCannotProbe(t *testing.T) {
	for role, want := range map[string]string{
		roleUnshare: "unshare(CLONE_NEWUSER) on one thread: invalid argument",
		roleUserns:  "not in a new user namespace: its uid_map maps",
		"bogus":     ProbeRoleEnv + `="bogus" names no probe`,
	} {
		results, err := probeChild(role, nil)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") || results != nil {
			t.Errorf("probe child %s: %v, %+v; want one line containing %q", role, err, results, want)
		}
	}
}

// netfence given the probe's variable by mistake, or by whoever could change the init
// container's environment and not its command, never succeeds: it prints the probe's answers and
// fails, and writes no table. It runs on a thread of its own network namespace: the probe drops
// that thread's CAP_NET_ADMIN.
func TestNetfenceWithTheProbesVariableFails(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: the replace probe needs a raw socket")
	}
	ns := newNetns(t)
	t.Setenv(ProbeRoleEnv, roleNoAdmin)
	var out strings.Builder
	var err error
	ns.Do(func() { err = Command([]string{"--reply-to", "10.88.0.0/16"}, &out) })
	if !errors.Is(err, errProbeChild) || !strings.Contains(out.String(), `{"probe":"IPT_SO_SET_REPLACE","errno":1}`) {
		t.Errorf("netfence with %s=%s: %v, printed %q; want the probe's answers and errProbeChild", ProbeRoleEnv, roleNoAdmin, err, out.String())
	}
}

// The verb proves the runtime before it writes a table, and a runtime not proven fails it in
// one line, with no table written. The verb runs in a network namespace of its own, so that a
// verb that wrote anyway would fence only that.
func TestCommandProvesTheRuntimeBeforeWritingTheTable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("not root: a verb that went on would write netfilter tables")
	}
	ns := newNetns(t)
	withProbes(t, probeReport{Results: concat(refusedSockets, grantedReplace)})
	var replaced int
	setReplace = func(family, int, []byte) error { replaced++; return syscall.EINVAL }
	t.Cleanup(func() { setReplace = family.setsockopt })
	var out strings.Builder
	var err error
	ns.Do(func() { err = Command([]string{"--reply-to", "10.88.0.0/16", "--allow", "10.0.0.0/8:443"}, &out) })
	var re *RuntimeError
	if !errors.As(err, &re) || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "runsc "+MinRunsc+" or later") || out.Len() != 0 || replaced != 0 {
		t.Errorf("netfence on a runtime that grants the replace: %v, printed %q, %d replaces; want one line naming %s and no table written", err, out.String(), replaced, MinRunsc)
	}
}
