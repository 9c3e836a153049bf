package modern_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/tests/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/runner"
	"github.com/sandbox-executor/sandbox-executor/tests/runner/localexecutor"
	"github.com/sandbox-executor/sandbox-executor/tests/runner/modern"
)

func localConfig(executor *localexecutor.Executor) modern.Config {
	return modern.Config{
		Executor:                 executor.Definition,
		ProcessEnv:               append(os.Environ(), executor.Env...),
		PreparationRetryInterval: -1,
	}
}

func run(t *testing.T, config modern.Config, job fakegitlab.Job) *modern.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	result, err := modern.Run(ctx, config, job)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("job log:\n%s\ncleanup log:\n%s", result.Log, result.CleanupLog)
		}
	})
	return result
}

// writeExecutable writes a bash script to dir/name and returns its path.
func writeExecutable(t *testing.T, dir, name, body string) string {
	t.Helper()
	file := filepath.Join(dir, name)
	if err := os.WriteFile(file, []byte("#!/usr/bin/env bash\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return file
}

func TestHelloJobThroughLocalExecutor(t *testing.T) {
	executor := localexecutor.New(t)
	job := fakegitlab.NewJob(fakegitlab.JobSpec{
		Image:       "alpine:3.20",
		Script:      []string{"echo hello", `echo "job env: $LOCAL_EXECUTOR_JOB_ENV"`},
		GitStrategy: "none",
	})

	result := run(t, localConfig(executor), job)

	if result.State != "success" || result.Err != nil {
		t.Fatalf("state %q err %v", result.State, result.Err)
	}
	if !strings.Contains(result.Log, "\nhello\n") {
		t.Errorf("job log lacks hello:\n%s", result.Log)
	}
	// job_env reaches run_exec (and so the script it runs) but, as in the
	// runner, not config_exec itself.
	if !strings.Contains(result.Log, "job env: from-config-exec") {
		t.Errorf("job_env did not reach the stage:\n%s", result.Log)
	}
	wantStages := []string{"prepare_script", "get_sources", "build_script", "cleanup_file_variables"}
	if !slices.Equal(result.Stages(), wantStages) {
		t.Errorf("stages %q, want %q", result.Stages(), wantStages)
	}
	wantEvents := []string{"config", "prepare", "run prepare_script", "run get_sources", "run build_script", "run cleanup_file_variables", "cleanup"}
	events := executor.Events(t)
	if len(events) != len(wantEvents) {
		t.Fatalf("executor calls %q, want %q", events, wantEvents)
	}
	for i, want := range wantEvents {
		if !strings.HasPrefix(events[i], want) {
			t.Errorf("call %d: %q, want %q", i, events[i], want)
		}
	}
	wantPrepare := "prepare job=" + jobIDString(job) + " image=alpine:3.20 response_file=set exit_code_file=set job_env=from-config-exec"
	if got := executor.Event(t, "prepare"); got != wantPrepare {
		t.Errorf("prepare saw %q, want %q", got, wantPrepare)
	}
	if !strings.Contains(result.CleanupLog, "cleaned up") || strings.Contains(result.Log, "cleaned up") {
		t.Errorf("cleanup output must go to the runner log only; job log:\n%s", result.Log)
	}
}

func jobIDString(job fakegitlab.Job) string {
	id, _ := job.Variable("CI_JOB_ID")
	return id
}

func TestFailingScriptReportsItsExitCodeAndRunsAfterScript(t *testing.T) {
	executor := localexecutor.New(t)
	job := fakegitlab.NewJob(fakegitlab.JobSpec{
		Script:      []string{"echo about to fail", "exit 3", "echo never printed"},
		AfterScript: []string{`echo "after_script sees $CI_JOB_STATUS"`},
		GitStrategy: "none",
	})

	result := run(t, localConfig(executor), job)

	if result.State != "failed" || result.FailureReason != modern.ReasonScriptFailure || result.ExitCode != 3 {
		t.Errorf("state %q reason %q exit code %d, want failed/script_failure/3", result.State, result.FailureReason, result.ExitCode)
	}
	if strings.Contains(result.Log, "never printed") {
		t.Error("the script went on after a failing command")
	}
	if !strings.Contains(result.Log, "after_script sees failed") {
		t.Errorf("after_script did not see CI_JOB_STATUS=failed:\n%s", result.Log)
	}
	wantStages := []string{"prepare_script", "get_sources", "build_script", "after_script", "cleanup_file_variables"}
	if !slices.Equal(result.Stages(), wantStages) {
		t.Errorf("stages %q, want %q", result.Stages(), wantStages)
	}
}

func TestFailingAfterScriptDoesNotFailTheJob(t *testing.T) {
	executor := localexecutor.New(t)
	job := fakegitlab.NewJob(fakegitlab.JobSpec{
		Script:      []string{"true"},
		AfterScript: []string{"exit 5"},
		GitStrategy: "none",
	})
	if result := run(t, localConfig(executor), job); result.State != "success" {
		t.Errorf("state %q reason %q, want success", result.State, result.FailureReason)
	}
}

// protocolProbe is an executor whose run_exec copies what it received.
type protocolProbe struct {
	dir        string
	definition runner.CustomExecutor
}

func newProtocolProbe(t *testing.T) protocolProbe {
	dir := t.TempDir()
	definition := runner.CustomExecutor{
		ConfigExec: writeExecutable(t, dir, "config", `echo '{"builds_dir":"'"$PROBE_DIR"'/builds","cache_dir":"'"$PROBE_DIR"'/cache","job_env":{"TMPDIR":"job-env-loses","FROM_JOB_ENV":"yes"}}'`),
		PrepareExec: writeExecutable(t, dir, "prepare", `cp "$JOB_RESPONSE_FILE" "$PROBE_DIR/response.json"
env > "$PROBE_DIR/prepare.env"`),
		RunExec: writeExecutable(t, dir, "run", `printf '%s\n' "$@" > "$PROBE_DIR/args.$3"
cp "$2" "$PROBE_DIR/script.$3"
stat -c %a "$2" > "$PROBE_DIR/mode.$3"
exec "$2"`),
		RunArgs: []string{"--run-arg"},
	}
	return protocolProbe{dir: dir, definition: definition}
}

func (p protocolProbe) read(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(p.dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestExecutablesGetTheRunnersEnvironmentArgsAndScripts(t *testing.T) {
	probe := newProtocolProbe(t)
	job := fakegitlab.NewJob(fakegitlab.JobSpec{
		Image:       "debian:12",
		Script:      []string{"echo probed"},
		GitStrategy: "none",
		Variables:   []fakegitlab.Variable{{Key: "MY_VAR", Value: "my value", Public: true}},
	})
	config := modern.Config{
		Executor:   probe.definition,
		ProcessEnv: append(os.Environ(), "PROBE_DIR="+probe.dir, "RUNNER_OWN_ENV=kept"),
	}

	result := run(t, config, job)
	if result.State != "success" {
		t.Fatalf("state %q: %v", result.State, result.Err)
	}

	var response fakegitlab.Job
	if err := json.Unmarshal([]byte(probe.read(t, "response.json")), &response); err != nil {
		t.Fatal(err)
	}
	if response.ID != job.ID || response.Token != job.Token || response.Image.Name != "debian:12" {
		t.Errorf("JOB_RESPONSE_FILE holds job %d token %q image %q", response.ID, response.Token, response.Image.Name)
	}

	env := map[string]string{}
	for _, line := range strings.Split(probe.read(t, "prepare.env"), "\n") {
		if key, value, ok := strings.Cut(line, "="); ok {
			env[key] = value
		}
	}
	wantEnv := map[string]string{
		"RUNNER_OWN_ENV":            "kept",
		"BUILD_FAILURE_EXIT_CODE":   "1",
		"SYSTEM_FAILURE_EXIT_CODE":  "2",
		"FROM_JOB_ENV":              "yes",
		"TMPDIR":                    "job-env-loses", // job_env comes after the runner's own variables
		"CUSTOM_ENV_CI_JOB_ID":      jobIDString(job),
		"CUSTOM_ENV_CI_JOB_IMAGE":   "debian:12",
		"CUSTOM_ENV_MY_VAR":         "my value",
		"CUSTOM_ENV_CI_JOB_TOKEN":   job.Token,
		"CUSTOM_ENV_CI_PROJECT_DIR": filepath.Join(probe.dir, "builds", "sandbox", "hello"),
		"CUSTOM_ENV_CI_JOB_STATUS":  "running",
	}
	for key, want := range wantEnv {
		if got := env[key]; got != want {
			t.Errorf("prepare_exec env %s=%q, want %q", key, got, want)
		}
	}
	for _, key := range []string{"BUILD_EXIT_CODE_FILE", "JOB_RESPONSE_FILE"} {
		if !strings.HasSuffix(env[key], map[string]string{"BUILD_EXIT_CODE_FILE": "/build_exit_code", "JOB_RESPONSE_FILE": "/response.json"}[key]) {
			t.Errorf("%s=%q", key, env[key])
		}
	}

	args := strings.Split(strings.TrimSpace(probe.read(t, "args.build_script")), "\n")
	if len(args) != 3 || args[0] != "--run-arg" || args[2] != "build_script" || filepath.Base(args[1]) != "script" {
		t.Errorf("run_exec args %q, want --run-arg <script> build_script", args)
	}
	if mode := strings.TrimSpace(probe.read(t, "mode.build_script")); mode != "700" {
		t.Errorf("script mode %s, want 700", mode)
	}
	script := probe.read(t, "script.build_script")
	if !strings.HasPrefix(script, "#!/usr/bin/env bash\n\ntrap exit 1 TERM\n") {
		t.Errorf("script does not start like the runner's:\n%s", script)
	}
}

func TestPrepareSystemFailureIsRetriedThreeTimes(t *testing.T) {
	dir := t.TempDir()
	config := modern.Config{
		BuildsDir: dir, CacheDir: dir,
		PreparationRetryInterval: -1,
		Executor: runner.CustomExecutor{
			PrepareExec: writeExecutable(t, dir, "prepare", `echo "cluster unreachable" >&2; exit "$SYSTEM_FAILURE_EXIT_CODE"`),
			RunExec:     writeExecutable(t, dir, "run", `exec "$1"`),
			CleanupExec: writeExecutable(t, dir, "cleanup", `echo cleanup`),
		},
	}
	result := run(t, config, fakegitlab.NewJob(fakegitlab.JobSpec{Script: []string{"true"}}))

	if result.State != "failed" || result.FailureReason != modern.ReasonSystemFailure {
		t.Errorf("state %q reason %q", result.State, result.FailureReason)
	}
	var calls []string
	for _, call := range result.Calls {
		calls = append(calls, call.Executable)
	}
	want := []string{"prepare", "cleanup", "prepare", "cleanup", "prepare", "cleanup"}
	if !slices.Equal(calls, want) {
		t.Errorf("calls %q, want %q", calls, want)
	}
	if strings.Count(result.Log, "cluster unreachable") != 3 {
		t.Errorf("prepare's stderr should be in the job log three times:\n%s", result.Log)
	}
}

func TestPrepareBuildFailureFailsFast(t *testing.T) {
	dir := t.TempDir()
	config := modern.Config{
		BuildsDir: dir, CacheDir: dir,
		Executor: runner.CustomExecutor{
			PrepareExec: writeExecutable(t, dir, "prepare", `echo "image not allowed"; exit "$BUILD_FAILURE_EXIT_CODE"`),
			RunExec:     writeExecutable(t, dir, "run", `exec "$1"`),
		},
	}
	result := run(t, config, fakegitlab.NewJob(fakegitlab.JobSpec{Script: []string{"true"}}))

	if result.FailureReason != modern.ReasonScriptFailure || len(result.Calls) != 1 {
		t.Errorf("reason %q after %d calls, want script_failure after 1", result.FailureReason, len(result.Calls))
	}
}

func TestConfigExecOutputIsValidated(t *testing.T) {
	for name, tc := range map[string]struct {
		output     string
		wantReason string
		wantCalls  int
	}{
		"invalid JSON is retried":       {`{"builds_dir":`, modern.ReasonSystemFailure, 3},
		"missing builds_dir fails fast": {`{"cache_dir":"/tmp"}`, modern.ReasonConfigurationError, 1},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			config := modern.Config{
				PreparationRetryInterval: -1,
				Executor: runner.CustomExecutor{
					ConfigExec: writeExecutable(t, dir, "config", "echo '"+tc.output+"'"),
					RunExec:    writeExecutable(t, dir, "run", `exec "$1"`),
				},
			}
			result := run(t, config, fakegitlab.NewJob(fakegitlab.JobSpec{Script: []string{"true"}}))
			if result.FailureReason != tc.wantReason || len(result.Calls) != tc.wantCalls {
				t.Errorf("reason %q after %d calls, want %q after %d", result.FailureReason, len(result.Calls), tc.wantReason, tc.wantCalls)
			}
		})
	}
}

func TestStageExitCodesFollowTheProtocol(t *testing.T) {
	for name, tc := range map[string]struct {
		runExec      string
		wantReason   string
		wantExitCode int
	}{
		"build failure without exit code file": {`exit 1`, modern.ReasonScriptFailure, 1},
		"build failure with exit code file":    {`echo 42 > "$BUILD_EXIT_CODE_FILE"; exit 1`, modern.ReasonScriptFailure, 42},
		"garbage in exit code file":            {`echo oops > "$BUILD_EXIT_CODE_FILE"; exit 1`, modern.ReasonSystemFailure, 0},
		"system failure":                       {`exit 2`, modern.ReasonSystemFailure, 0},
		"undefined exit code":                  {`exit 7`, modern.ReasonSystemFailure, 0},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			config := modern.Config{
				BuildsDir: dir, CacheDir: dir,
				Executor: runner.CustomExecutor{
					RunExec: writeExecutable(t, dir, "run", `if [ "$2" = build_script ]; then `+tc.runExec+`; fi; exec "$1"`),
				},
			}
			result := run(t, config, fakegitlab.NewJob(fakegitlab.JobSpec{Script: []string{"true"}, GitStrategy: "none"}))
			if result.FailureReason != tc.wantReason || result.ExitCode != tc.wantExitCode {
				t.Errorf("reason %q exit code %d, want %q %d", result.FailureReason, result.ExitCode, tc.wantReason, tc.wantExitCode)
			}
		})
	}
}

// signalingWriter closes found the first time text has been written.
type signalingWriter struct {
	mu      sync.Mutex
	text    string
	written strings.Builder
	found   chan struct{}
}

func newSignalingWriter(text string) *signalingWriter {
	return &signalingWriter{text: text, found: make(chan struct{})}
}

func (w *signalingWriter) Write(data []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	alreadyFound := strings.Contains(w.written.String(), w.text)
	w.written.Write(data)
	if !alreadyFound && strings.Contains(w.written.String(), w.text) {
		close(w.found)
	}
	return len(data), nil
}

func TestCancelTerminatesTheStageAndStillCleansUp(t *testing.T) {
	executor := localexecutor.New(t)
	config := localConfig(executor)
	started := newSignalingWriter("sleeping now")
	config.LogOutput = started
	job := fakegitlab.NewJob(fakegitlab.JobSpec{
		Script:      []string{"echo sleeping now", "sleep 60"},
		AfterScript: []string{"echo after"},
		GitStrategy: "none",
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-started.found
		cancel()
	}()
	begin := time.Now()
	result, err := modern.Run(ctx, config, job)
	if err != nil {
		t.Fatal(err)
	}

	if result.FailureReason != modern.ReasonJobCanceled {
		t.Errorf("reason %q, want job_canceled\n%s", result.FailureReason, result.Log)
	}
	if elapsed := time.Since(begin); elapsed > 10*time.Second {
		t.Errorf("cancel took %v; SIGTERM to the process group should end the stage at once", elapsed)
	}
	wantStages := []string{"prepare_script", "get_sources", "build_script"}
	if !slices.Equal(result.Stages(), wantStages) {
		t.Errorf("stages %q, want %q (nothing after a cancel)", result.Stages(), wantStages)
	}
	if last := result.Calls[len(result.Calls)-1]; last.Executable != modern.ExecutableCleanup || last.Err != nil {
		t.Errorf("last call %+v, want a successful cleanup", last)
	}
}

func TestStageIgnoringSIGTERMIsKilledAfterGracefulTimeout(t *testing.T) {
	dir := t.TempDir()
	config := modern.Config{
		BuildsDir: dir, CacheDir: dir,
		Executor: runner.CustomExecutor{
			RunExec:             writeExecutable(t, dir, "run", `if [ "$2" = build_script ]; then trap '' TERM; echo stubborn; sleep 60; fi; exec "$1"`),
			GracefulKillTimeout: 200 * time.Millisecond,
			ForceKillTimeout:    5 * time.Second,
		},
	}
	job := fakegitlab.NewJob(fakegitlab.JobSpec{Script: []string{"true"}, GitStrategy: "none", Timeout: 2 * time.Second})

	begin := time.Now()
	result := run(t, config, job)
	if result.FailureReason != modern.ReasonJobExecutionTimeout {
		t.Errorf("reason %q, want job_execution_timeout", result.FailureReason)
	}
	if elapsed := time.Since(begin); elapsed > 10*time.Second {
		t.Errorf("took %v: the stage was not killed after the graceful timeout", elapsed)
	}
	buildScript := result.Calls[len(result.Calls)-1]
	if buildScript.Stage != "build_script" || buildScript.ExitCode != -1 {
		t.Errorf("last call %+v, want build_script ended by a signal", buildScript)
	}
}

func TestMaskedVariablesAreHiddenInTheJobLog(t *testing.T) {
	executor := localexecutor.New(t)
	job := fakegitlab.NewJob(fakegitlab.JobSpec{Script: []string{`echo "token=$CI_JOB_TOKEN"`}, GitStrategy: "none"})
	result := run(t, localConfig(executor), job)
	if strings.Contains(result.Log, job.Token) || !strings.Contains(result.Log, "token=[MASKED]") {
		t.Errorf("job token not masked:\n%s", result.Log)
	}
}

func TestFetchStrategyChecksOutTheCommit(t *testing.T) {
	repository := t.TempDir()
	git := func(args ...string) string {
		t.Helper()
		command := exec.Command("git", append([]string{"-C", repository, "-c", "user.name=test", "-c", "user.email=test@example.com"}, args...)...)
		output, err := command.CombinedOutput()
		if err != nil {
			t.Fatalf("git %q: %v\n%s", args, err, output)
		}
		return strings.TrimSpace(string(output))
	}
	git("init", "-q", "-b", "main")
	if err := os.WriteFile(filepath.Join(repository, "README"), []byte("from the repository\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git("add", "README")
	git("commit", "-q", "-m", "initial")
	sha := git("rev-parse", "HEAD")

	executor := localexecutor.New(t)
	job := fakegitlab.NewJob(fakegitlab.JobSpec{
		Script:  []string{"cat README"},
		RepoURL: "file://" + repository,
		SHA:     sha,
	})
	result := run(t, localConfig(executor), job)
	if result.State != "success" || !strings.Contains(result.Log, "\nfrom the repository\n") {
		t.Errorf("state %q; log:\n%s", result.State, result.Log)
	}
}

func TestCacheArtifactsAndDependencyStagesCallTheRunnerCommand(t *testing.T) {
	executor := localexecutor.New(t)
	config := localConfig(executor)
	callsFile := filepath.Join(t.TempDir(), "runner-calls")
	config.RunnerCommand = writeExecutable(t, t.TempDir(), "gitlab-runner", `echo "$*" >> `+callsFile)
	job := fakegitlab.NewJob(fakegitlab.JobSpec{
		Script:       []string{"mkdir -p out && echo built > out/result"},
		AfterScript:  []string{"true"},
		GitStrategy:  "none",
		Cache:        []fakegitlab.Cache{{Key: "deps", Paths: []string{"vendor/"}}},
		Artifacts:    []fakegitlab.Artifact{{Paths: []string{"out/"}, When: fakegitlab.WhenOnSuccess, ExpireIn: "1 day"}},
		Dependencies: []fakegitlab.Dependency{{ID: 7, Token: "dep-token", Name: "compile", ArtifactsFile: fakegitlab.DependencyArtifactsFile{Filename: "artifacts.zip"}}},
	})

	result := run(t, config, job)
	if result.State != "success" {
		t.Fatalf("state %q: %v", result.State, result.Err)
	}
	wantStages := []string{"prepare_script", "get_sources", "restore_cache", "download_artifacts", "build_script",
		"after_script", "archive_cache", "upload_artifacts_on_success", "cleanup_file_variables"}
	if !slices.Equal(result.Stages(), wantStages) {
		t.Errorf("stages %q, want %q", result.Stages(), wantStages)
	}
	calls, err := os.ReadFile(callsFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"cache-extractor --file " + filepath.Join(executor.Dir, "cache", "sandbox", "hello", "deps", "cache.zip"),
		"artifacts-downloader --url http://127.0.0.1 --token dep-token --id 7",
		"cache-archiver --file", "--path vendor/",
		"artifacts-uploader --url http://127.0.0.1 --token " + job.Token,
		"--path out/ --artifact-format zip --artifact-type archive --expire-in 1 day",
	} {
		if !strings.Contains(string(calls), want) {
			t.Errorf("runner command calls lack %q:\n%s", want, calls)
		}
	}
}
