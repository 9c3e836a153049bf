package app_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
)

// BenchmarkRunStage is what a run stage of an empty script costs on this host, on the fake
// cluster and the real agent (the stage over exec to the agent run on the host), per path:
//
//   - served: the whole path the runner takes with run_exec naming the stage launcher: the
//     launcher's process (started and waited for, as the runner does), the hand-over, the stage
//     in the server;
//   - direct, in-process: the same stage's work in the executor, without its process;
//   - executor process: what sandbox-executor's own process adds to that on the direct path
//     (fork, exec, Go's initialisation, exit: `sandbox-executor version`).
//
// The direct path costs about the sum of the last two; the rows are interleaved, so that drift on
// a shared machine hits every path alike. Not part of make unit (it builds the binaries):
//
//	go test -run '^$' -bench BenchmarkRunStage -benchtime 200x ./cmd/sandbox-executor/app/
func BenchmarkRunStage(b *testing.B) {
	bin := buildCommands(b, "sandbox-executor", "sandbox-executor-stage")
	socket := filepath.Join(b.TempDir(), "server", "stages.sock")
	h := newHarnessWithConfig(b, "ci:bookworm", fmt.Sprintf("stage_server = %q", socket))
	startStageServer(b, h, socket)
	if code, out, errOut := h.run("prepare"); code != 0 {
		b.Fatalf("prepare: exit %d\n%s%s", code, out, errOut)
	}
	script := h.script("true\n")
	environ := h.deps().Environ()
	var served, direct, start time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		launcher := exec.Command(filepath.Join(bin, "sandbox-executor-stage"), "run", script, "build_script")
		launcher.Env = environ
		if out, err := launcher.CombinedOutput(); err != nil {
			b.Fatalf("served run: %v\n%s", err, out)
		}
		served += time.Since(t0)

		t0 = time.Now()
		if code, out, errOut := h.run("run", script, "build_script"); code != 0 {
			b.Fatalf("direct run: exit %d\n%s%s", code, out, errOut)
		}
		direct += time.Since(t0)

		t0 = time.Now()
		if out, err := exec.Command(filepath.Join(bin, "sandbox-executor"), "version").CombinedOutput(); err != nil {
			b.Fatalf("sandbox-executor version: %v\n%s", err, out)
		}
		start += time.Since(t0)
	}
	b.StopTimer()
	perOp := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
	b.ReportMetric(perOp(served), "served-ms/stage")
	b.ReportMetric(perOp(direct), "in-process-ms/stage")
	b.ReportMetric(perOp(start), "executor-process-ms")
	b.ReportMetric(perOp(direct)+perOp(start), "direct-ms/stage")
	b.ReportMetric(0, "ns/op") // the rows above are the result; the loop's total is all three
}

// buildCommands builds the module's commands into a temporary directory and returns it.
func buildCommands(b *testing.B, names ...string) string {
	b.Helper()
	root, err := testutil.ModuleRoot()
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	args := []string{"build", "-o", dir + string(os.PathSeparator)}
	for _, name := range names {
		args = append(args, "./cmd/"+name)
	}
	build := exec.Command("go", args...)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	return dir
}
