package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandbox-executor/sandbox-executor/cmd/sandbox-executor-stage/launcher"
	"github.com/sandbox-executor/sandbox-executor/cmd/sandbox-executor/app"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/fakecluster"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// startStageServer serves the harness's stages on socket until stop is called.
func startStageServer(t testing.TB, h *harness, socket string) (log *testutil.LockedBuffer, stop func()) {
	t.Helper()
	log = &testutil.LockedBuffer{}
	serve, err := app.StageServer(socket, time.Second, h.deps(), log, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("stage server: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return log, stop
}

// With stage_server set, prepare and cleanup run in the stage server with the stage's own
// environment (its exit codes, its job), run keeps its own process, and the job log is the same.
func TestStagesGoThroughTheStageServer(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "server", "stages.sock")
	h := newHarnessWithConfig(t, "ci:bookworm", fmt.Sprintf("stage_server = %q", socket))
	serverLog, stop := startStageServer(t, h, socket)

	code, out, errOut := h.run("prepare")
	if code != 0 || !strings.Contains(out+errOut, "pool duo-default (warm start)") {
		t.Fatalf("prepare: exit %d\n%s%s", code, out, errOut)
	}
	if strings.Contains(out+errOut, "runs in its own process") {
		t.Errorf("prepare did not go through the server:\n%s", errOut)
	}
	if code, out, errOut := h.run("run", h.script("echo from the pod\n"), "build_script"); code != 0 || !strings.Contains(out+errOut, "from the pod") {
		t.Fatalf("run: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := h.run("cleanup"); code != 0 {
		t.Fatalf("cleanup: exit %d\n%s%s", code, out, errOut)
	}
	claims := h.cluster.Extensions.ExtensionsV1beta1().SandboxClaims(fakecluster.Namespace)
	if _, err := claims.Get(context.Background(), kube.ClaimName(testToken, "test-runner", 777), metav1.GetOptions{}); err == nil {
		t.Error("the claim outlived cleanup")
	}
	log := serverLog.String()
	for _, want := range []string{"prepare exited 0", "cleanup exited 0"} {
		if !strings.Contains(log, want) {
			t.Errorf("server log lacks %q:\n%s", want, log)
		}
	}
	if strings.Contains(log, "run exited") {
		t.Errorf("run went through the server:\n%s", log)
	}
	for name, value := range secrets {
		if strings.Contains(log, value) {
			t.Errorf("%s appears in the server's log", name)
		}
	}

	// A permanent failure in the server exits with this stage's BUILD_FAILURE_EXIT_CODE, with
	// its one line in this stage's output.
	h.env["BUILD_FAILURE_EXIT_CODE"] = "7"
	rewriteJobImage(t, h, "evil/miner:latest")
	code, out, errOut = h.run("prepare")
	if code != 7 || !strings.Contains(errOut, `ERROR: image not allowed: "evil/miner:latest"`) {
		t.Errorf("prepare of a refused image: exit %d, want 7\n%s%s", code, out, errOut)
	}

	// No server listening: the stage runs here, and says so.
	stop()
	code, out, errOut = h.run("cleanup")
	if code != 0 || !strings.Contains(errOut, "no stage server listening on "+socket+": cleanup runs in its own process") {
		t.Errorf("cleanup without a server: exit %d\n%s%s", code, out, errOut)
	}
}

func rewriteJobImage(t *testing.T, h *harness, image string) {
	t.Helper()
	path := h.env["JOB_RESPONSE_FILE"]
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var job map[string]any
	if err := json.Unmarshal(data, &job); err != nil {
		t.Fatal(err)
	}
	job["image"] = map[string]any{"name": image}
	data, _ = json.Marshal(job)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// launch runs the stage launcher (run_exec, prepare_exec, cleanup_exec naming
// sandbox-executor-stage) as the runner would start it for this job, with signals as its
// process's; exec is true when it would have become sandbox-executor instead (nothing served).
func (h *harness) launch(signals <-chan os.Signal, stdout, stderr io.Writer, args ...string) (code int, exec bool) {
	self := filepath.Join(h.tmp, "bin", "sandbox-executor-stage")
	code = launcher.Launch(context.Background(), launcher.Process{
		Args: append([]string{self}, args...), Environ: h.deps().Environ(), Started: time.Now(),
		Stdout: stdout, Stderr: stderr, Signals: signals, Self: self,
		Exec: func(string, []string, []string) error { exec = true; return syscall.ENOENT },
	})
	return code, exec
}

// With run_exec naming the stage launcher, run stages go through the stage server like prepare
// and cleanup, on the fake cluster and the real agent: their output in full, the script's exit
// code as a build failure, the runner's cancel stopping the script in the pod, and the stage
// run in its own process when no server answers.
func TestRunStagesThroughTheLauncherAndTheServer(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "server", "stages.sock")
	h := newHarnessWithConfig(t, "ci:bookworm", fmt.Sprintf("stage_server = %q", socket))
	serverLog, stop := startStageServer(t, h, socket)
	step := func(want int, args ...string) (string, string) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		code, exec := h.launch(nil, &stdout, &stderr, args...)
		if code != want || exec {
			t.Fatalf("%v: exit %d (became the executor: %v), want %d\nstdout: %s\nstderr: %s", args, code, exec, want, stdout.String(), stderr.String())
		}
		return stdout.String(), stderr.String()
	}
	step(0, "prepare")

	// A large output, byte for byte and in order (the script's stderr joins its stdout in the
	// pod, as in a terminal), over two dropped streams that the server re-attaches.
	h.local.CutAfter, h.local.Cuts = 100000, 2
	var want strings.Builder
	for i := 1; i <= 50000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	want.WriteString("done\n")
	out, errOut := step(0, "run", h.script("i=1; while [ $i -le 50000 ]; do echo $i; i=$((i+1)); done\necho done >&2\n"), "build_script")
	if out != want.String() {
		t.Errorf("run relayed %d bytes of stdout (want %d exactly), ending %q", len(out), want.Len(), out[max(0, len(out)-20):])
	}
	if strings.Count(errOut, "dropped") != 2 || !strings.Contains(errOut, "re-attaching at byte") {
		t.Errorf("run's stderr does not show the two re-attaches:\n%s", errOut)
	}
	// The script's failure: BUILD_FAILURE_EXIT_CODE, its code in BUILD_EXIT_CODE_FILE.
	step(1, "run", h.script("echo failing; exit 42\n"), "after_script")
	if code, _ := os.ReadFile(h.env["BUILD_EXIT_CODE_FILE"]); strings.TrimSpace(string(code)) != "42" {
		t.Errorf("BUILD_EXIT_CODE_FILE = %q, want 42", code)
	}

	// The runner's SIGTERM to the launcher (cancel, timeout): the server stops the script in the
	// pod and the stage ends as a system failure, as in its own process.
	signals := make(chan os.Signal, 1)
	var stdout, stderr testutil.LockedBuffer
	done := make(chan int, 1)
	started := time.Now()
	go func() {
		code, _ := h.launch(signals, &stdout, &stderr, "run", h.script("echo stage-started\nsleep 60\necho must-not-be-reached\n"), "step_script")
		done <- code
	}()
	for !strings.Contains(stdout.String(), "stage-started") {
		if time.Since(started) > 30*time.Second {
			t.Fatalf("the stage did not start: %q %q", stdout.String(), stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	signals <- syscall.SIGTERM
	select {
	case code := <-done:
		if code != 2 || !strings.Contains(stderr.String(), "Stage step_script cancelled: its processes in pod") || strings.Contains(stdout.String(), "must-not-be-reached") {
			t.Errorf("cancelled run: exit %d, want 2\nstdout: %s\nstderr: %s", code, stdout.String(), stderr.String())
		}
	case <-time.After(40 * time.Second):
		t.Fatal("the cancelled run did not end")
	}
	step(0, "cleanup")
	log := serverLog.String()
	for _, want := range []string{"prepare exited 0", "run exited 0", "run exited 1", "run exited 2", "cleanup exited 0"} {
		if !strings.Contains(log, want) {
			t.Errorf("server log lacks %q:\n%s", want, log)
		}
	}

	// No server answering: the launcher becomes the executor, which runs the stage itself.
	stop()
	if code, exec := h.launch(nil, io.Discard, io.Discard, "run", h.script("true\n"), "build_script"); !exec {
		t.Errorf("run without a server: exit %d without becoming the executor", code)
	}
}
