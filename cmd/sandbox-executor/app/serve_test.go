package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandbox-executor/sandbox-executor/cmd/sandbox-executor/app"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/fakecluster"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// startStageServer serves the harness's stages on socket until stop is called.
func startStageServer(t *testing.T, h *harness, socket string) (log *testutil.LockedBuffer, stop func()) {
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
