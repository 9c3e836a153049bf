//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/agentca"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/clusterjobs"
	"github.com/sandbox-executor/sandbox-executor/tests/harness/localcluster"
)

// TestStagesAsModernRunnerInvokesThem drives the binary directly with the environment and
// arguments of a 17.x runner, and cancels a stage with SIGTERM: the stage's processes must be
// gone from the pod, checked from outside, before cleanup. On both run paths (served: the
// launcher relays the SIGTERM to the stage server, which stops the stage).
func TestStagesAsModernRunnerInvokesThem(t *testing.T) {
	t.Parallel()
	onEachRunPath(t, testStagesAsModernRunnerInvokesThem)
}

func testStagesAsModernRunnerInvokesThem(t *testing.T, path runPath) {
	c := newClusterOn(t, path)
	j, pod, prep := preparedJob(t, c, ciImage)
	out, err := j.Command("config").Output()
	if err != nil || !strings.Contains(string(out), `"builds_dir":"/builds"`) {
		t.Fatalf("config: %v %s", err, out)
	}

	// A failing stage: exit code in BUILD_EXIT_CODE_FILE, BUILD_FAILURE exit.
	fail := j.Command("run", j.Script(t, "echo failing\nexit 7\n"), "build_script")
	if out, err := fail.CombinedOutput(); clusterjobs.ExitCode(err) != 1 || !strings.Contains(string(out), "failing") {
		t.Errorf("failing stage: exit %d, output %q; want 1", clusterjobs.ExitCode(err), out)
	}
	if code, _ := os.ReadFile(j.ExitCodeFile()); strings.TrimSpace(string(code)) != "7" {
		t.Errorf("BUILD_EXIT_CODE_FILE = %q, want 7", code)
	}

	// Cancel: SIGTERM to the stage's process group, as the runner does.
	run := j.Command("run", j.Script(t, "sleep 600 &\nsleep 601 &\necho stage-started\nwait\n"), "build_script")
	live := clusterjobs.NewLive()
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
	t.Logf("run exited %d %s after SIGTERM", clusterjobs.ExitCode(err), time.Since(cancelled))
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
	t.Parallel()
	c := newCluster(t)
	j, _, prep := preparedJob(t, c, localcluster.PosixImage)
	mustContain(t, "prepare log", prep, "pool "+localcluster.PosixPool, "shell /bin/sh", "gvisor")
	script := j.Script(t, "set -e\necho \"bash-$(test -e /bin/bash && echo present || echo absent)\"\nuname -r\nexit 4\n")
	out, err := j.Command("run", script, "build_script").CombinedOutput()
	if clusterjobs.ExitCode(err) != 1 {
		t.Fatalf("run: exit %d, want BUILD_FAILURE (1)\n%s", clusterjobs.ExitCode(err), out)
	}
	mustContain(t, "stage output", string(out), "bash-absent", "gvisor")
	if code, _ := os.ReadFile(j.ExitCodeFile()); strings.TrimSpace(string(code)) != "4" {
		t.Errorf("BUILD_EXIT_CODE_FILE = %q, want 4", code)
	}
}

// TestNetworkTransport runs stages over the pod network (stage_transport = "network"): same
// output and exit codes as over exec; and the agent serves nobody but the job's executor: not a
// plain-text request, not a client certificate of another CA, not another job's certificate of
// the right CA.
func TestNetworkTransport(t *testing.T) {
	t.Parallel()
	c := newCluster(t, `stage_transport = "network"`)
	j, _, prep := preparedJob(t, c, ciImage)
	mustContain(t, "prepare log", prep, "stages over pod network (TLS)")
	script, want := numbered(2000, 2001, 5) // no pauses
	var stdout, stderr bytes.Buffer
	run := j.Command("run", j.Script(t, script), "build_script")
	run.Stdout, run.Stderr = &stdout, &stderr
	if err := run.Run(); clusterjobs.ExitCode(err) != 1 {
		t.Fatalf("exit %d, want BUILD_FAILURE (1): %s", clusterjobs.ExitCode(err), stderr.String())
	}
	if stdout.String() != want {
		t.Fatalf("output differs: got %d bytes, want %d", stdout.Len(), len(want))
	}
	if code, _ := os.ReadFile(j.ExitCodeFile()); strings.TrimSpace(string(code)) != "5" {
		t.Errorf("BUILD_EXIT_CODE_FILE = %q, want 5", code)
	}
	_, state := j.AgentExecutor(t, nil)
	addr := net.JoinHostPort(j.PodObject(t).Status.PodIP, strconv.Itoa(wire.NetworkPort))
	// The request the agent must not serve: kill the job's stage directory.
	request := []byte(wire.RequestHeader([]string{"kill", "--dir", wire.StagesDir + "/x"}, 0))

	plain, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("the agent is not reachable over the pod network: %v (prepare log: %s)", err, prep)
	}
	defer plain.Close()
	_, _ = plain.Write(request)
	_ = plain.SetReadDeadline(time.Now().Add(15 * time.Second))
	if _, err := wire.ReadFrames(plain, io.Discard, io.Discard); err == nil {
		t.Error("a plain-text request was answered")
	}

	otherCA, err := agentca.New("another installation", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	clusterCA, err := agentca.Load(c.AgentCA())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, refusal string
		ca            *agentca.CA
	}{
		{"a client certificate of another CA", "", otherCA},
		{"another job's certificate of the agent CA", "belongs to another job", clusterCA},
	} {
		config, err := tc.ca.ClientConfig("another-job", state.Transport.AgentIdentity)
		if err != nil {
			t.Fatal(err)
		}
		var refusal bytes.Buffer
		code, err := tlsRequest(addr, config, request, &refusal)
		if tc.refusal == "" && err == nil || tc.refusal != "" && (err != nil || code != wire.ExitRefused || !strings.Contains(refusal.String(), tc.refusal)) {
			t.Errorf("%s: exit %d, %q, %v; want it refused", tc.name, code, refusal.String(), err)
		}
	}
}

// tlsRequest sends one request to the agent at addr over TLS and reads its answer.
func tlsRequest(addr string, config *tls.Config, request []byte, stderr io.Writer) (int, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, config)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	if _, err := conn.Write(request); err != nil {
		return 0, err
	}
	return wire.ReadFrames(conn, io.Discard, stderr)
}
