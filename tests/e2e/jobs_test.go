//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/tests/clustertest"
	"github.com/sandbox-executor/sandbox-executor/tests/localcluster"
)

// TestStagesAsModernRunnerInvokesThem drives the binary directly with the environment and
// arguments of a 17.x runner, and cancels a stage with SIGTERM: the stage's processes must be
// gone from the pod, checked from outside, before cleanup.
func TestStagesAsModernRunnerInvokesThem(t *testing.T) {
	c := newCluster(t)
	j, pod, prep := preparedJob(t, c, ciImage)
	out, err := j.Command("config").Output()
	if err != nil || !strings.Contains(string(out), `"builds_dir":"/builds"`) {
		t.Fatalf("config: %v %s", err, out)
	}

	// A failing stage: exit code in BUILD_EXIT_CODE_FILE, BUILD_FAILURE exit.
	fail := j.Command("run", j.Script(t, "echo failing\nexit 7\n"), "build_script")
	if out, err := fail.CombinedOutput(); clustertest.ExitCode(err) != 1 || !strings.Contains(string(out), "failing") {
		t.Errorf("failing stage: exit %d, output %q; want 1", clustertest.ExitCode(err), out)
	}
	if code, _ := os.ReadFile(j.ExitCodeFile()); strings.TrimSpace(string(code)) != "7" {
		t.Errorf("BUILD_EXIT_CODE_FILE = %q, want 7", code)
	}

	// Cancel: SIGTERM to the stage's process group, as the runner does.
	run := j.Command("run", j.Script(t, "sleep 600 &\nsleep 601 &\necho stage-started\nwait\n"), "build_script")
	live := clustertest.NewLive()
	run.Stdout, run.Stderr = live, live
	run.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	live.Wait("stage-started", 60*time.Second)
	if ps, err := c.Exec(context.Background(), pod, "sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"); !strings.Contains(ps, "sleep 600") {
		t.Fatalf("the stage's sleep is not running in pod %s before cancel: %q %v", pod, ps, err)
	}
	cancelled := time.Now()
	syscall.Kill(-run.Process.Pid, syscall.SIGTERM)
	err = run.Wait()
	t.Logf("run exited %d %s after SIGTERM", clustertest.ExitCode(err), time.Since(cancelled))
	if ps, _ := c.Exec(context.Background(), pod, "sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"); strings.Contains(ps, "sleep 60") {
		t.Errorf("processes of the cancelled stage survive in the pod: %q", ps)
	}
	// after_script still runs after a cancel.
	after, err := j.Command("run", j.Script(t, "echo after-script-ran\n"), "after_script").CombinedOutput()
	if err != nil || !strings.Contains(string(after), "after-script-ran") {
		t.Errorf("after_script after cancel: %v %q", err, after)
	}
	for _, secret := range []string{jobToken, duoToken} {
		if strings.Contains(prep+string(after)+live.String(), secret) {
			t.Errorf("secret %q appears in our output", secret)
		}
	}
}

// TestPOSIXOnlyImage runs stages in an image with nothing but POSIX sh (dash) and coreutils: the
// agent's install, the detached stage and its exit code need no more. (The runner's own bash
// scripts use $'...' quoting, which dash lacks: that part needs the runner's sh support.)
func TestPOSIXOnlyImage(t *testing.T) {
	c := newCluster(t)
	j, _, prep := preparedJob(t, c, localcluster.PosixImage)
	mustContain(t, "prepare log", prep, "pool "+localcluster.PosixPool, "shell /bin/sh", "gvisor")
	script := j.Script(t, "set -e\necho \"bash-$(test -e /bin/bash && echo present || echo absent)\"\nuname -r\nexit 4\n")
	out, err := j.Command("run", script, "build_script").CombinedOutput()
	if clustertest.ExitCode(err) != 1 {
		t.Fatalf("run: exit %d, want BUILD_FAILURE (1)\n%s", clustertest.ExitCode(err), out)
	}
	mustContain(t, "stage output", string(out), "bash-absent", "gvisor")
	if code, _ := os.ReadFile(j.ExitCodeFile()); strings.TrimSpace(string(code)) != "4" {
		t.Errorf("BUILD_EXIT_CODE_FILE = %q, want 4", code)
	}
}

// TestNetworkTransport runs stages over the pod network (stage_transport = "network"): same
// output, exit codes and cancel as over exec, and the agent refuses requests without the token.
func TestNetworkTransport(t *testing.T) {
	c := newCluster(t, `stage_transport = "network"`)
	j, _, prep := preparedJob(t, c, ciImage)
	script, want := numbered(2000, 2001, 5) // no pauses
	var stdout, stderr bytes.Buffer
	run := j.Command("run", j.Script(t, script), "build_script")
	run.Stdout, run.Stderr = &stdout, &stderr
	if err := run.Run(); clustertest.ExitCode(err) != 1 {
		t.Fatalf("exit %d, want BUILD_FAILURE (1): %s", clustertest.ExitCode(err), stderr.String())
	}
	if stdout.String() != want {
		t.Fatalf("output differs: got %d bytes, want %d", stdout.Len(), len(want))
	}
	if code, _ := os.ReadFile(j.ExitCodeFile()); strings.TrimSpace(string(code)) != "5" {
		t.Errorf("BUILD_EXIT_CODE_FILE = %q, want 5", code)
	}
	ip := j.PodObject(t).Status.PodIP
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(ip, strconv.Itoa(wire.NetworkPort)), 5*time.Second)
	if err != nil {
		t.Fatalf("the agent is not reachable over the pod network: %v (prepare log: %s)", err, prep)
	}
	defer conn.Close()
	io.WriteString(conn, wire.RequestHeader("not-the-token-not-the-token-not-the", []string{"kill", "--dir", wire.StagesDir + "/x"}, 0))
	var refusal bytes.Buffer
	code, err := wire.ReadFrames(conn, io.Discard, &refusal)
	if err != nil || code != wire.ExitRefused || !strings.Contains(refusal.String(), "unauthorized") {
		t.Errorf("a request with a wrong token: exit %d, %q, %v; want it refused", code, refusal.String(), err)
	}
}
