package executor_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/fakecluster"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

func newStageRunner(ex kube.RemoteExecutor, log *testutil.LockedBuffer, podGone string) *executor.StageRunner {
	return &executor.StageRunner{
		Exec:       ex,
		Sandbox:    &kube.Sandbox{Namespace: "ns", Pod: "job-pod", Container: "job"},
		PodGone:    func(context.Context) (string, error) { return podGone, nil },
		Log:        fakecluster.JobLog(log),
		Reconnects: 5,
		Backoff:    wait.Backoff{Duration: time.Millisecond},
		KillGrace:  2 * time.Second,
	}
}

// numberedLines is a script whose complete output is easy to check for loss and duplication.
func numberedLines(n int) (script, want string) {
	var w strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&w, "line %04d of the stage output\n", i)
	}
	return fmt.Sprintf("i=1; while [ $i -le %d ]; do printf 'line %%04d of the stage output\\n' $i; i=$((i+1)); done\n", n), w.String()
}

// inBothModes runs a test with stages started by a supervisor per stage (no daemon) and by the
// job's stage daemon.
func inBothModes(t *testing.T, test func(t *testing.T, newLocal func(testing.TB) *fakecluster.Local)) {
	t.Run("supervisor", func(t *testing.T) { test(t, fakecluster.NewLocal) })
	t.Run("daemon", func(t *testing.T) { test(t, fakecluster.NewLocalWithDaemon) })
}

func TestStageRunnerDeliversOutputAndExitCode(t *testing.T) {
	inBothModes(t, testDeliversOutputAndExitCode)
}

func testDeliversOutputAndExitCode(t *testing.T, newLocal func(testing.TB) *fakecluster.Local) {
	local := newLocal(t)
	var stdout, stderr, log testutil.LockedBuffer
	r := newStageRunner(local, &log, "")
	code, err := r.Run(context.Background(), "build_script", []byte("echo hello; echo to-stderr >&2; exit 3\n"), &stdout, &stderr)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if code != 3 {
		t.Errorf("exit code = %d, want 3", code)
	}
	if got, want := stdout.String(), "hello\nto-stderr\n"; got != want {
		t.Errorf("output = %q, want %q", got, want)
	}
	if log.String() != "" {
		t.Errorf("an undisturbed stage should log nothing, got %q", log.String())
	}
	// Who waited for the stage: the daemon leaves no keeper in the stage's session (0), a
	// supervisor names itself.
	keepers, _ := filepath.Glob(filepath.Join(local.Agent.StagesDir(), "*", "keeper"))
	if len(keepers) != 1 {
		t.Fatalf("keeper files: %v", keepers)
	}
	keeper, _ := os.ReadFile(keepers[0])
	if daemon := strings.HasSuffix(t.Name(), "/daemon"); daemon != (string(keeper) == "0") {
		t.Errorf("keeper %q in mode %s: the stage did not start the way the mode says", keeper, t.Name())
	}
}

func TestStageRunnerScriptTravelsOnStdinOnly(t *testing.T) {
	local := fakecluster.NewLocal(t)
	var out, log testutil.LockedBuffer
	script := "echo $((40+2)) # glpat-SECRET-IN-SCRIPT\n"
	if _, err := newStageRunner(local, &log, "").Run(context.Background(), "build_script", []byte(script), &out, &out); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range local.Commands() {
		if strings.Contains(strings.Join(cmd, " "), "SECRET") {
			t.Fatalf("script content leaked into exec argv: %q", cmd)
		}
	}
	if local.Stdins()[0] != script {
		t.Errorf("stdin = %q, want the script", local.Stdins()[0])
	}
}

func TestStageRunnerResumesAfterDroppedStreams(t *testing.T) {
	inBothModes(t, testResumesAfterDroppedStreams)
}

func testResumesAfterDroppedStreams(t *testing.T, newLocal func(testing.TB) *fakecluster.Local) {
	for _, tc := range []struct {
		name     string
		exitCode int
	}{{"passing", 0}, {"failing", 7}} {
		t.Run(tc.name, func(t *testing.T) {
			local := newLocal(t)
			local.CutAfter, local.Cuts = 1000, 4 // several drops in one stage
			script, want := numberedLines(2000)
			script += "exit " + strconv.Itoa(tc.exitCode) + "\n"
			var stdout, stderr, log testutil.LockedBuffer
			code, err := newStageRunner(local, &log, "").Run(context.Background(), "build_script", []byte(script), &stdout, &stderr)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if code != tc.exitCode {
				t.Errorf("exit code = %d, want %d", code, tc.exitCode)
			}
			if stdout.String() != want {
				t.Fatalf("output differs after resume: got %d bytes, want %d (lost or duplicated bytes)", len(stdout.String()), len(want))
			}
			if n := strings.Count(log.String(), "re-attaching"); n != 4 {
				t.Errorf("reconnects noted %d times in the job log, want 4:\n%s", n, log.String())
			}
			starts := 0
			for _, cmd := range local.Commands() {
				if cmd[1] == "start" {
					starts++
				}
			}
			if starts != 5 {
				t.Errorf("start commands = %d, want 5", starts)
			}
		})
	}
}

func TestStageRunnerNeverReportsSuccessWithoutStatus(t *testing.T) {
	local := fakecluster.NewLocal(t)
	local.CutAfter, local.Cuts = 10, 100
	script, _ := numberedLines(500)
	var out, log testutil.LockedBuffer
	r := newStageRunner(local, &log, "")
	r.Reconnects = 2
	code, err := r.Run(context.Background(), "build_script", []byte(script), &out, &out)
	if err == nil {
		t.Fatalf("Run succeeded with exit %d although every stream dropped", code)
	}
	if failure.KindOf(err) != failure.KindSystem || !strings.Contains(err.Error(), "exit status is unknown") {
		t.Errorf("err = %v, want a system failure saying the status is unknown", err)
	}
	waitStagesEnded(t, local.Agent.StagesDir())
}

// waitStagesEnded waits for the stages a test left running (detached, as in a pod) to record
// their status, so that they are not writing while the test's directory is removed.
func waitStagesEnded(t *testing.T, stagesDir string) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		dirs, _ := filepath.Glob(filepath.Join(stagesDir, "*"))
		statuses, _ := filepath.Glob(filepath.Join(stagesDir, "*", "status"))
		if len(statuses) == len(dirs) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("stages still running 10s after the test: %v", dirs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestStageRunnerLostPodIsSystemFailureNamingThePod(t *testing.T) {
	local := fakecluster.NewLocal(t)
	local.CutAfter, local.Cuts = 5, 1
	var out, log testutil.LockedBuffer
	r := newStageRunner(local, &log, "pod ns/job-pod was deleted")
	_, err := r.Run(context.Background(), "build_script", []byte("echo 0123456789; sleep 0.2\n"), &out, &out)
	if failure.KindOf(err) != failure.KindSystem || !strings.Contains(err.Error(), "job-pod was deleted") {
		t.Fatalf("err = %v, want a system failure naming the deleted pod", err)
	}
}

func TestStageRunnerRefusesTruncatedScript(t *testing.T) {
	local := fakecluster.NewLocal(t)
	var out, log testutil.LockedBuffer
	r := newStageRunner(&truncatingExec{local}, &log, "")
	_, err := r.Run(context.Background(), "build_script", []byte("echo executed-marker\n"), &out, &out)
	if err == nil || failure.KindOf(err) != failure.KindSystem || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("err = %v, want a system failure about the truncated script", err)
	}
	if strings.Contains(out.String(), "executed-marker") {
		t.Fatal("a truncated script was run")
	}
}

// truncatingExec delivers only half of stdin, as a stream cut mid-upload would.
type truncatingExec struct{ next kube.RemoteExecutor }

func (e *truncatingExec) Exec(ctx context.Context, req kube.ExecRequest) error {
	if req.Stdin != nil {
		var b bytes.Buffer
		b.ReadFrom(req.Stdin)
		req.Stdin = bytes.NewReader(b.Bytes()[:b.Len()/2])
	}
	return e.next.Exec(ctx, req)
}

func TestStageRunnerCancelStopsTheWholeProcessTree(t *testing.T) {
	inBothModes(t, testCancelStopsTheWholeProcessTree)
}

func testCancelStopsTheWholeProcessTree(t *testing.T, newLocal func(testing.TB) *fakecluster.Local) {
	local := newLocal(t)
	pidFile := filepath.Join(t.TempDir(), "pids")
	// A child, and a grandchild in its own process group, both ignoring nothing special.
	script := fmt.Sprintf("sleep 300 & echo $! >> %[1]s; (set -m 2>/dev/null; sleep 301 & echo $! >> %[1]s; wait) & echo started; wait\n", pidFile)
	var out, log testutil.LockedBuffer
	ctx, cancel := context.WithCancel(context.Background())
	r := newStageRunner(local, &log, "")
	errc := make(chan error, 1)
	go func() {
		_, err := r.Run(ctx, "build_script", []byte(script), &out, &out)
		errc <- err
	}()
	waitFor(t, func() bool { return strings.Contains(out.String(), "started") && countLines(pidFile) == 2 })
	pids := readPids(t, pidFile)
	cancel()
	err := <-errc
	if !errors.Is(err, executor.ErrCancelled) {
		t.Fatalf("err = %v, want ErrCancelled", err)
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("process %d of the cancelled stage is still running", pid)
		}
	}
	if !strings.Contains(log.String(), "cancelled") {
		t.Errorf("job log does not mention the cancel: %q", log.String())
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func countLines(path string) int {
	data, _ := os.ReadFile(path)
	return strings.Count(string(data), "\n")
}

func readPids(t *testing.T, path string) []int {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		pid, _ := strconv.Atoi(f)
		pids = append(pids, pid)
	}
	return pids
}

// alive is true for a live, non-zombie process.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(data, ')')
	return i < 0 || !bytes.HasPrefix(bytes.TrimSpace(data[i+1:]), []byte("Z"))
}

func TestStageRunnerNeverRestartsALostStage(t *testing.T) {
	local := fakecluster.NewLocal(t)
	local.CutAfter, local.Cuts = 5, 1
	var out, log testutil.LockedBuffer
	ex := &wipingExec{t: t, next: local}
	_, err := newStageRunner(ex, &log, "").Run(context.Background(), "build_script", []byte("echo 0123456789-first-run; sleep 0.3; echo done\n"), &out, &out)
	if err == nil || failure.KindOf(err) != failure.KindSystem || !strings.Contains(err.Error(), "stage is gone") {
		t.Fatalf("err = %v, want a system failure saying the stage is gone", err)
	}
	if n := strings.Count(out.String(), "01234"); n != 1 {
		t.Errorf("the stage ran %d times, want once:\n%s", n, out.String())
	}
}

// wipingExec deletes every stage directory before the second start, once the first run has
// ended (else its status would land in the wiped directory), as a pod restart would.
type wipingExec struct {
	t      *testing.T
	next   *fakecluster.Local
	starts int
}

func (w *wipingExec) Exec(ctx context.Context, req kube.ExecRequest) error {
	if req.Command[1] == "start" {
		w.starts++
		if w.starts == 2 {
			waitStagesEnded(w.t, w.next.Agent.StagesDir())
			os.RemoveAll(w.next.Agent.StagesDir())
		}
	}
	return w.next.Exec(ctx, req)
}

// Tools the executor ships into the pod (BinDir) come before the image's own on every stage's PATH.
func TestStageRunnerPutsBinDirFirstOnPath(t *testing.T) {
	inBothModes(t, func(t *testing.T, newLocal func(testing.TB) *fakecluster.Local) {
		local := newLocal(t)
		var stdout, stderr, log testutil.LockedBuffer
		code, err := newStageRunner(local, &log, "").Run(context.Background(), "build_script", []byte("echo \"$PATH\"\n"), &stdout, &stderr)
		if err != nil || code != 0 {
			t.Fatalf("Run: code %d, %v", code, err)
		}
		bin := filepath.Join(filepath.Dir(local.Agent.StagesDir()), "bin")
		if got := stdout.String(); !strings.HasPrefix(got, bin+":") || !strings.Contains(got, "/bin") {
			t.Errorf("PATH = %q, want %s first, then the image's", got, bin)
		}
	})
}

// refusingAgent is an agent that refuses the job (the pod bound to another).
type refusingAgent struct{ calls int }

func (r *refusingAgent) Exec(context.Context, kube.ExecRequest) error {
	r.calls++
	return &executor.RefusedError{Addr: "10.88.0.9:7543", Reason: "this sandbox belongs to another job"}
}

func TestStageRunnerEndsTheJobWhenTheAgentRefusesIt(t *testing.T) {
	agent := &refusingAgent{}
	r := &executor.StageRunner{
		Exec: agent, Sandbox: &kube.Sandbox{Namespace: "ns", Pod: "job-pod", Container: "job"},
		PodGone:    func(context.Context) (string, error) { return "", nil },
		Log:        fakecluster.JobLog(&strings.Builder{}),
		Reconnects: 5, Backoff: wait.Backoff{Duration: time.Millisecond},
	}
	_, err := r.Run(context.Background(), "build_script", []byte("echo hi\n"), io.Discard, io.Discard)
	if failure.KindOf(err) != failure.KindSystem || !strings.Contains(err.Error(), "refused this job's stage (this sandbox belongs to another job)") {
		t.Fatalf("err = %v, want a system failure naming the agent's refusal", err)
	}
	if agent.calls != 1 {
		t.Errorf("the runner tried %d times, want 1: the same agent gives the same answer", agent.calls)
	}
}
