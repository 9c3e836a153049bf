package launcher

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sandbox-executor/sandbox-executor/buildinfo"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/stageservertest"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
	"github.com/sandbox-executor/sandbox-executor/stageserver"
)

func TestMain(m *testing.M) {
	if os.Getenv(asLauncher) != "" {
		// The test binary started as the runner starts the launcher (TestSignalsToTheLauncher).
		Main()
	}
	goleak.VerifyTestMain(m)
}

// asLauncher in its environment makes the test binary the launcher itself (Main).
const asLauncher = "SANDBOX_EXECUTOR_TEST_AS_LAUNCHER"

// install lays out a launcher next to an executor and a config naming socket as its stage
// server ("": none), and returns the launcher's path and the config's.
func install(t *testing.T, socket string) (self, cfg string) {
	t.Helper()
	dir := t.TempDir()
	cfg = filepath.Join(dir, "config.toml")
	text := "namespace = \"ci\"\nrunner_name = \"r1\"\n"
	if socket != "" {
		text += fmt.Sprintf("stage_server = %q\n", socket)
	}
	text += "[[pool]]\nname = \"duo\"\nimages = [\"ci:bookworm\"]\n"
	if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "bin", "sandbox-executor-stage"), cfg
}

// server serves stages on a socket of its own with handler, until the test ends.
func server(t *testing.T, handler stageserver.Handler) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "run", "stages.sock")
	stageservertest.Serve(t, socket, buildinfo.Version, handler)
	return socket
}

// execCall is what the launcher tried to become.
type execCall struct {
	path       string
	argv, envv []string
}

// launch runs the launcher as the runner would, recording an exec instead of doing it.
func launch(t *testing.T, self string, args, environ []string) (code int, stdout, stderr string, exec *execCall) {
	t.Helper()
	var out, errOut bytes.Buffer
	p := Process{
		Args: append([]string{self}, args...), Environ: environ, Started: time.Unix(1700000000, 0),
		Stdout: &out, Stderr: &errOut, Self: self,
		Exec: func(path string, argv, envv []string) error {
			exec = &execCall{path, argv, envv}
			return syscall.ENOENT // as execve says of a missing executor
		},
	}
	code = Launch(context.Background(), p)
	return code, out.String(), errOut.String(), exec
}

var runnerEnv = []string{"BUILD_FAILURE_EXIT_CODE=11", "SYSTEM_FAILURE_EXIT_CODE=12", "CUSTOM_ENV_CI_JOB_ID=7"}

// prepare and cleanup go to the stage server as the executor itself would hand them over: the
// config's absolute path, the stage's whole environment, its start; the launcher relays the
// output and exits with the stage's code, and never starts the executor.
func TestHandsTheStageToTheServer(t *testing.T) {
	var got []stageserver.Request
	socket := server(t, func(_ context.Context, req stageserver.Request, stdout, stderr io.Writer) int {
		got = append(got, req)
		fmt.Fprintln(stdout, "Sandbox ready")
		fmt.Fprintln(stderr, "warning")
		return 3
	})
	self, cfg := install(t, socket)
	for _, args := range [][]string{{"--config", cfg, "prepare"}, {"-config=" + cfg, "cleanup"}} {
		code, stdout, stderr, exec := launch(t, self, args, runnerEnv)
		if code != 3 || stdout != "Sandbox ready\n" || stderr != "warning\n" || exec != nil {
			t.Errorf("%v: exit %d, stdout %q, stderr %q, exec %+v; want the server's stage", args, code, stdout, stderr, exec)
		}
	}
	environ := append([]string{"SANDBOX_EXECUTOR_CONFIG=" + cfg}, runnerEnv...)
	if code, _, _, exec := launch(t, self, []string{"prepare"}, environ); code != 3 || exec != nil {
		t.Errorf("config from $SANDBOX_EXECUTOR_CONFIG: exit %d, exec %+v", code, exec)
	}
	if len(got) != 3 {
		t.Fatalf("the server ran %d stages, want 3", len(got))
	}
	// run, with the script's path made absolute: the server has a working directory of its own.
	t.Chdir(t.TempDir())
	wd, _ := os.Getwd()
	if code, _, _, exec := launch(t, self, []string{"--config", cfg, "run", "script.", "build_script"}, runnerEnv); code != 3 || exec != nil {
		t.Fatalf("run: exit %d, exec %+v; want the server's stage", code, exec)
	}
	want := []string{"sandbox-executor", "--config", cfg, "run", filepath.Join(wd, "script."), "build_script"}
	if strings.Join(got[3].Args, " ") != strings.Join(want, " ") {
		t.Errorf("run's args %q; want %q", got[3].Args, want)
	}
	if want := []string{"sandbox-executor", "--config", cfg, "prepare"}; strings.Join(got[0].Args, " ") != strings.Join(want, " ") || got[1].Args[3] != "cleanup" {
		t.Errorf("args %q, %q; want %q", got[0].Args, got[1].Args, want)
	}
	if got[0].Getenv("CUSTOM_ENV_CI_JOB_ID") != "7" || got[0].Version != buildinfo.Version || !got[0].Started.Equal(time.Unix(1700000000, 0)) {
		t.Errorf("request %+v: want the stage's environment, build and start", got[0])
	}
}

// Whatever the launcher cannot hand over, the executor runs: the same arguments and environment,
// the executor next to the launcher, and nothing sent to any server.
func TestBecomesTheExecutorForAnythingElse(t *testing.T) {
	var served int
	socket := server(t, func(context.Context, stageserver.Request, io.Writer, io.Writer) int { served++; return 0 })
	self, cfg := install(t, socket)
	_, noServer := install(t, "")
	_, nobodyListening := install(t, filepath.Join(t.TempDir(), "stages.sock"))
	broken := filepath.Join(t.TempDir(), "broken.toml")
	if err := os.WriteFile(broken, []byte("stage_server = 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, args := range map[string][]string{
		"run without its stage":   {"--config", cfg, "run", "/tmp/script"},
		"run with a third":        {"--config", cfg, "run", "/tmp/script", "build_script", "x"},
		"config":                  {"--config", cfg, "config"},
		"a flag it does not know": {"--config", cfg, "prepare", "--debug"},
		"help":                    {"--help"},
		"no stage":                {"--config", cfg},
		"no stage_server":         {"--config", noServer, "prepare"},
		"nobody listening":        {"--config", nobodyListening, "prepare"},
		"run, nobody listening":   {"--config", nobodyListening, "run", "/tmp/script", "build_script"},
		"a broken config":         {"--config", broken, "prepare"},
		"a missing config":        {"--config", "/nonexistent.toml", "cleanup"},
	} {
		t.Run(name, func(t *testing.T) {
			code, stdout, stderr, exec := launch(t, self, args, runnerEnv)
			wantPath := filepath.Join(filepath.Dir(self), "sandbox-executor")
			if exec == nil || exec.path != wantPath || strings.Join(exec.argv, " ") != strings.Join(append([]string{wantPath}, args...), " ") ||
				strings.Join(exec.envv, " ") != strings.Join(runnerEnv, " ") {
				t.Fatalf("exec %+v; want %s with the same arguments and environment", exec, wantPath)
			}
			// The recorded exec "found no executor": a broken install, in one line, not retried.
			if code != 11 || stdout != "" || !strings.HasPrefix(stderr, "sandbox-executor: ERROR: the stage launcher cannot start "+wantPath+": no such file or directory (install sandbox-executor next to sandbox-executor-stage)") {
				t.Errorf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
			}
		})
	}
	if served != 0 {
		t.Errorf("the server ran %d stages, want none", served)
	}
}

// The flag forms the executor takes, the launcher takes too, with the same value.
func TestConfigFlagForms(t *testing.T) {
	socket := server(t, func(_ context.Context, req stageserver.Request, stdout, _ io.Writer) int {
		fmt.Fprint(stdout, req.Args[2])
		return 0
	})
	self, cfg := install(t, socket)
	_, other := install(t, socket)
	for _, args := range [][]string{{"--config", cfg, "prepare"}, {"-config", cfg, "prepare"}, {"--config=" + cfg, "prepare"}, {"-config=" + cfg, "prepare"},
		{"--config", other, "--config", cfg, "prepare"}} {
		if code, stdout, _, exec := launch(t, self, args, runnerEnv); code != 0 || stdout != cfg || exec != nil {
			t.Errorf("%q: exit %d, config %q, exec %+v; want %s handed over", args, code, stdout, exec, cfg)
		}
	}
}

// Why the launcher could not become the executor decides the exit code: a missing or unrunnable
// executor is the install's fault (not retried); a transient failure, or the runner's cancel
// before it, is a system failure.
func TestExecFailures(t *testing.T) {
	self, cfg := install(t, "")
	for err, want := range map[error]string{
		syscall.EACCES:  "11 the stage launcher cannot start",
		syscall.ETXTBSY: "12 the stage launcher cannot start",
		errCancelled:    "12 the stage was cancelled before it started",
	} {
		var stderr bytes.Buffer
		code := Launch(context.Background(), Process{Args: []string{self, "--config", cfg, "prepare"}, Environ: runnerEnv, Stdout: io.Discard, Stderr: &stderr, Self: self,
			Exec: func(string, []string, []string) error { return err }})
		if got := fmt.Sprintf("%d %s", code, strings.TrimPrefix(stderr.String(), "sandbox-executor: ERROR: ")); !strings.HasPrefix(got, want) {
			t.Errorf("exec failing with %v: %q, want %q", err, got, want)
		}
	}
}

// A server that goes away mid-stage is a system failure, which the runner retries: the stage
// never exits as if it had succeeded or as the script's failure.
func TestAServerLostMidStageIsASystemFailure(t *testing.T) {
	socket := server(t, func(_ context.Context, _ stageserver.Request, _, stderr io.Writer) int {
		fmt.Fprintln(stderr, "claiming")
		panic("lost")
	})
	self, cfg := install(t, socket)
	code, _, stderr, exec := launch(t, self, []string{"--config", cfg, "prepare"}, runnerEnv)
	if code != 12 || exec != nil || !strings.Contains(stderr, "claiming\nsandbox-executor: ERROR: stage server "+socket+": the stage server closed the connection before the stage ended") {
		t.Errorf("exit %d, exec %+v, stderr %q; want a system failure naming the server", code, exec, stderr)
	}
}

// What makes the launcher fast is what it does not link: client-go (its API schemes are most of
// the executor's start-up) and the executor's stages.
func TestLinksNoClientGo(t *testing.T) {
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	list := exec.Command("go", "list", "-deps", "./cmd/sandbox-executor-stage")
	list.Dir = root
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	const module = "github.com/sandbox-executor/sandbox-executor/"
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "k8s.io/client-go/") || strings.HasPrefix(pkg, "k8s.io/api/") ||
			pkg == module+"stages" || strings.HasPrefix(pkg, module+"stages/") || pkg == module+"kube" {
			t.Errorf("the stage launcher links %s", pkg)
		}
	}
}

// The runner's SIGTERM (cancel, timeout) cancels a stage handed to the server there: the stage
// ends as it would in its own process, and the launcher relays how.
func TestASignalCancelsTheStageInTheServer(t *testing.T) {
	running := make(chan struct{})
	socket := server(t, func(ctx context.Context, _ stageserver.Request, stdout, _ io.Writer) int {
		close(running)
		<-ctx.Done()
		fmt.Fprintln(stdout, "cancelled in the server")
		return 12
	})
	self, cfg := install(t, socket)
	signals := make(chan os.Signal, 1)
	go func() {
		<-running
		signals <- syscall.SIGTERM
	}()
	var stdout bytes.Buffer
	code := Launch(context.Background(), Process{Args: []string{self, "--config", cfg, "prepare"}, Environ: runnerEnv, Stdout: &stdout, Stderr: io.Discard,
		Signals: signals, Self: self, Exec: func(string, []string, []string) error { t.Error("the launcher tried to exec"); return nil }})
	if code != 12 || stdout.String() != "cancelled in the server\n" {
		t.Errorf("exit %d, stdout %q; want the stage cancelled in the server and its exit", code, stdout.String())
	}
}

// tagged writes what it is given to a shared log, tagged by stream, in the order it came.
type tagged struct {
	log *[]string
	tag string
}

func (w tagged) Write(p []byte) (int, error) {
	*w.log = append(*w.log, w.tag+string(p))
	return len(p), nil
}

// run goes to the server like prepare and cleanup: its output relayed in the order the stage
// wrote it across stdout and stderr, byte for byte however large, and its exit code (the script's
// failure as BUILD_FAILURE_EXIT_CODE, the server's as SYSTEM_FAILURE_EXIT_CODE) as the launcher's.
func TestRunIsServedWithItsOutputInOrderAndItsExitCode(t *testing.T) {
	big := make([]byte, 1<<20+13) // over many output frames
	for i := range big {
		big[i] = byte(i*7 + i>>9)
	}
	var want []string
	for i := range 40 {
		want = append(want, fmt.Sprintf("out: line %d\n", i), fmt.Sprintf("err: line %d\n", i))
	}
	socket := server(t, func(_ context.Context, req stageserver.Request, stdout, stderr io.Writer) int {
		for i := range 40 {
			fmt.Fprintf(stdout, "line %d\n", i)
			fmt.Fprintf(stderr, "line %d\n", i)
		}
		stdout.Write(big)
		switch req.Args[len(req.Args)-1] {
		case "build_script":
			return 11 // the script failed: the stage's BUILD_FAILURE_EXIT_CODE
		case "after_script":
			return 12
		}
		return 0
	})
	self, cfg := install(t, socket)
	for stage, wantCode := range map[string]int{"build_script": 11, "after_script": 12, "step_script": 0} {
		var log []string
		p := Process{Args: []string{self, "--config", cfg, "run", "/tmp/script", stage}, Environ: runnerEnv,
			Stdout: tagged{&log, "out: "}, Stderr: tagged{&log, "err: "}, Self: self,
			Exec: func(string, []string, []string) error { t.Error("the launcher tried to exec"); return nil }}
		if code := Launch(context.Background(), p); code != wantCode {
			t.Errorf("%s: exit %d, want %d", stage, code, wantCode)
		}
		if len(log) < len(want) || strings.Join(log[:len(want)], "") != strings.Join(want, "") {
			t.Fatalf("%s: output out of order: %q", stage, log[:min(len(log), len(want))])
		}
		var got bytes.Buffer
		for _, w := range log[len(want):] {
			got.WriteString(strings.TrimPrefix(w, "out: "))
		}
		if !bytes.Equal(got.Bytes(), big) {
			t.Errorf("%s: %d bytes of stdout after the lines, want the stage's %d exactly", stage, got.Len(), len(big))
		}
	}
}

// startLauncher starts the launcher as its own process, as the runner starts run_exec, and
// returns it once the stage has written its first line in the server, with its stderr (read it
// after Wait).
func startLauncher(t *testing.T, cfg string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "--config", cfg, "run", "/tmp/script", "build_script")
	cmd.Env = append(append(os.Environ(), asLauncher+"=1"), runnerEnv...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	first := make([]byte, len("started\n"))
	if _, err := io.ReadFull(stdout, first); err != nil || string(first) != "started\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("the launcher's first output %q, %v; stderr %q", first, err, stderr.String())
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	return cmd, &stderr
}

// The runner's signals to run_exec's process reach the stage in the server: SIGTERM (cancel,
// timeout) cancels it there and the launcher relays how it stopped and its exit code, as the
// executor's own process does; a SIGKILL (the runner's force kill, after graceful_kill_timeout)
// drops the connection, and the server cancels the stage too, which stops its script in the pod.
func TestSignalsToTheLauncher(t *testing.T) {
	stopped := make(chan string, 1)
	socket := server(t, func(ctx context.Context, req stageserver.Request, stdout, stderr io.Writer) int {
		fmt.Fprint(stdout, "started\n")
		<-ctx.Done()
		// What the stage runner does on a cancel: stop the script in the pod, and say so.
		fmt.Fprintln(stderr, "Stage build_script cancelled: its processes in pod p were stopped")
		stopped <- req.Args[len(req.Args)-1]
		return 12
	})
	_, cfg := install(t, socket)
	t.Run("SIGTERM", func(t *testing.T) {
		cmd, stderr := startLauncher(t, cfg)
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			t.Fatal("the stage in the server was not cancelled by the launcher's SIGTERM")
		}
		err := cmd.Wait()
		if code := cmd.ProcessState.ExitCode(); code != 12 || !strings.Contains(stderr.String(), "Stage build_script cancelled: its processes in pod p were stopped") {
			t.Errorf("the launcher exited %d (%v), stderr %q; want the stage's 12 and how it stopped", code, err, stderr.String())
		}
	})
	t.Run("SIGKILL", func(t *testing.T) {
		cmd, _ := startLauncher(t, cfg)
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			t.Fatal("the stage in the server went on after its launcher was killed")
		}
	})
}
