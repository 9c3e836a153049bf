//go:build runner

// These tests run the real gitlab-runner (17.9.0 from ../shared/tools by default; see the
// package doc for SANDBOX_EXECUTOR_GITLAB_RUNNER and SANDBOX_EXECUTOR_GITLAB_RUNNER_HELPER):
//
//	go test -tags runner -race ./tests/runner/...
//	go test -tags runner -run '^$' -bench . -benchtime 10x ./tests/runner/
//
// Without the binaries they fail and say so. They prove the harness (fake GitLab, runner
// driver, the runner's helper for artifacts) with the local executor, which runs the job's
// scripts on this host.
package runner_test

import (
	"archive/zip"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/runner"
	"github.com/sandbox-executor/sandbox-executor/tests/runner/localexecutor"
)

func requireBinary(t testing.TB) string {
	t.Helper()
	binary, err := runner.BinaryPath()
	if err != nil {
		t.Fatal(err)
	}
	return binary
}

func newServer(t testing.TB, options ...fakegitlab.Option) *fakegitlab.Server {
	server := fakegitlab.New(options...)
	t.Cleanup(server.Close)
	return server
}

// runnerOptions runs the local executor under the real runner; the executor's environment puts
// the runner's helper first on PATH as `gitlab-runner`, for the artifact stages.
func runnerOptions(t testing.TB, server *fakegitlab.Server, executor *localexecutor.Executor) runner.Options {
	return runner.Options{
		Binary:   requireBinary(t),
		URL:      server.URL(),
		Token:    server.RunnerToken(),
		Executor: executor.Definition,
		Env:      slices.Clone(executor.Env),
	}
}

// runJob hands job to `gitlab-runner run-single` and waits for GitLab to learn the outcome.
func runJob(t testing.TB, server *fakegitlab.Server, executor *localexecutor.Executor, job fakegitlab.Job) fakegitlab.Result {
	t.Helper()
	jobID := server.Enqueue(job)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	runnerResult, err := runner.RunSingle(ctx, runnerOptions(t, server, executor))
	if err != nil {
		t.Fatal(err)
	}
	result, err := server.Wait(ctx, jobID)
	if err != nil {
		t.Fatalf("%v\nrunner log:\n%s", err, runnerResult.Log)
	}
	logOnFailure(t, runnerResult.Log, result.Trace)
	return result
}

func logOnFailure(t testing.TB, runnerLog, trace string) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("runner log:\n%s\njob trace:\n%s", runnerLog, trace)
		}
	})
}

func TestRunnerRunsHelloJobThroughLocalExecutor(t *testing.T) {
	server := newServer(t, fakegitlab.WithLongPolling(10*time.Second))
	executor := localexecutor.New(t)
	job := server.NewJob(fakegitlab.JobSpec{Image: "alpine:3.20", Script: []string{"echo hello"}, GitStrategy: "none"})

	result := runJob(t, server, executor, job)

	if result.State != fakegitlab.StateSuccess {
		t.Errorf("job state %q (reason %q), want success", result.State, result.FailureReason)
	}
	if !strings.Contains(result.Trace, "\nhello\n") {
		t.Error("trace lacks the script's output")
	}
	version, err := runner.Version(requireBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	if result.Runner.Version != version || result.Runner.Executor != "custom" {
		t.Errorf("job taken by %+v, want gitlab-runner %s with the custom executor", result.Runner, version)
	}
	if strings.Contains(result.Trace, "cleaned up") {
		t.Error("cleanup_exec output reached the job log")
	}
	// The runner gives prepare the job JSON, the exit code file and config_exec's job_env, and
	// job_env to every later executable; it skips the stages with nothing to do (no cache, no
	// artifacts, no after_script), and step_script arrives as build_script.
	jobEnv := "job_env=from-config-exec"
	wantEvents := []string{"config",
		"prepare job=" + strconv.FormatInt(job.ID, 10) + " image=alpine:3.20 response_file=set exit_code_file=set " + jobEnv,
		"run prepare_script " + jobEnv, "run get_sources " + jobEnv, "run build_script " + jobEnv,
		"run cleanup_file_variables " + jobEnv, "cleanup " + jobEnv}
	if events := executor.Events(t); !slices.Equal(events, wantEvents) {
		t.Errorf("executor calls %q,\nwant %q", events, wantEvents)
	}
}

func TestRunnerReportsTheScriptsExitCode(t *testing.T) {
	for name, tc := range map[string]struct {
		afterScript []string
		// afterScriptWarning is the runner's warning about a failed after_script, if any.
		afterScriptWarning string
	}{
		"after_script succeeds": {afterScript: []string{"echo after script ran"}},
		// The local executor rewrites BUILD_EXIT_CODE_FILE on every failure: the warning names
		// after_script's own code, the job keeps the script's.
		"after_script fails too": {afterScript: []string{"echo after script ran", "exit 9"},
			afterScriptWarning: "after_script failed, but job will continue unaffected: exit status 9"},
	} {
		t.Run(name, func(t *testing.T) {
			server := newServer(t, fakegitlab.WithLongPolling(10*time.Second))
			executor := localexecutor.New(t)
			job := server.NewJob(fakegitlab.JobSpec{
				Script:      []string{"echo about to fail", "exit 3"},
				AfterScript: tc.afterScript,
				GitStrategy: "none",
			})

			result := runJob(t, server, executor, job)

			if result.State != fakegitlab.StateFailed || result.FailureReason != fakegitlab.FailureScript {
				t.Errorf("job state %q reason %q, want failed/%s", result.State, result.FailureReason, fakegitlab.FailureScript)
			}
			if result.ExitCode == nil || *result.ExitCode != 3 {
				t.Errorf("final update carries exit code %v, want 3", derefOrNil(result.ExitCode))
			}
			for _, want := range []string{"about to fail", "after script ran", "Job failed: exit status 3"} {
				if !strings.Contains(result.Trace, want) {
					t.Errorf("trace lacks %q", want)
				}
			}
			if tc.afterScriptWarning != "" && !strings.Contains(result.Trace, tc.afterScriptWarning) {
				t.Errorf("trace lacks %q", tc.afterScriptWarning)
			}
		})
	}
}

func derefOrNil(code *int) any {
	if code == nil {
		return nil
	}
	return *code
}

// markerSeconds is a `sleep` argument unique to this test process and job: the job's marker
// processes are `sleep <it>`, which a scan of /proc finds and nothing else matches.
func markerSeconds(jobID int64) string {
	return fmt.Sprintf("86399.%d%d", os.Getpid(), jobID)
}

// procScan, run with eval, counts in $found the processes running `sleep $MARKER_SECONDS` and
// lists them; its own text does not contain the value.
const procScan = `found=0; for p in /proc/[0-9]*; do c=$(tr '\0' ' ' 2>/dev/null < "$p/cmdline") || continue; ` +
	`case "$c" in *"sleep $MARKER_SECONDS"*) found=$((found+1)); echo "marker process: ${p#/proc/} $c";; esac; done`

// TestRunnerCancelsGracefully cancels a running job the way GitLab's cancel button does on
// 17.x: trace patches are answered with Job-Status: canceling. The runner stops the script,
// runs after_script with CI_JOB_STATUS=canceled and reports the job.
func TestRunnerCancelsGracefully(t *testing.T) {
	server := newServer(t, fakegitlab.WithLongPolling(10*time.Second))
	executor := localexecutor.New(t)
	id := fakegitlab.NextJobID()
	job := server.NewJob(fakegitlab.JobSpec{
		ID: id,
		Variables: []fakegitlab.Variable{
			{Key: "MARKER_SECONDS", Value: markerSeconds(id), Public: true},
			{Key: "PROC_SCAN", Value: procScan, Public: true, Raw: true}, // raw: the runner expands $x in other values
		},
		// Two marker processes, the second in a child shell; the scan sees both before the
		// script goes on (a positive control of the scan after_script runs).
		Script: []string{`sleep "$MARKER_SECONDS" &`, `sh -c 'sleep "$MARKER_SECONDS"' &`,
			`until eval "$PROC_SCAN" >/dev/null; [ "$found" -ge 2 ]; do sleep 0.1; done`,
			`echo "build-started with $found marker processes"`, "while :; do echo tick; sleep 1; done"},
		AfterScript: []string{`echo "after_script sees CI_JOB_STATUS=$CI_JOB_STATUS"`, `eval "$PROC_SCAN"; echo "marker processes left: $found"`},
		GitStrategy: "none",
	})
	server.Enqueue(job)
	process, err := runner.Start(runnerOptions(t, server, executor))
	if err != nil {
		t.Fatal(err)
	}
	defer process.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The runner hears of the cancel in the answer to its next trace patch; the ticks make one.
	if partial, err := server.WaitForTrace(ctx, job.ID, "build-started with 2 marker processes"); err != nil {
		t.Fatalf("%v\nrunner log:\n%s\njob trace so far:\n%s", err, process.Log(), partial.Trace)
	}
	if err := server.CancelGracefully(job.ID); err != nil {
		t.Fatal(err)
	}
	result, err := server.Wait(ctx, job.ID)
	if err != nil {
		t.Fatalf("%v\nrunner log:\n%s", err, process.Log())
	}
	logOnFailure(t, process.Log(), result.Trace)

	// job_canceled is internal to the runner: GitLab hears unknown_failure.
	if result.State != fakegitlab.StateCanceled || result.ReportedState != fakegitlab.StateFailed || result.FailureReason != fakegitlab.FailureUnknown {
		t.Errorf("state %q reported %q (%q), want canceled, reported failed (%s)", result.State, result.ReportedState, result.FailureReason, fakegitlab.FailureUnknown)
	}
	for _, want := range []string{"after_script sees CI_JOB_STATUS=canceled", "marker processes left: 0"} {
		if !strings.Contains(result.Trace, want) {
			t.Errorf("trace lacks %q", want)
		}
	}
	if _, err := process.Wait(ctx); err != nil {
		t.Error(err)
	}
	if executor.Event(t, "cleanup") == "" {
		t.Error("cleanup_exec was not called after the cancel")
	}
}

func TestRunSingleExitsWhenNoJobArrivesAndStopEndsARunner(t *testing.T) {
	server := newServer(t) // no long polling: the runner re-polls every 3 s
	executor := localexecutor.New(t)

	options := runnerOptions(t, server, executor)
	options.WaitTimeout = time.Second
	result, err := runner.RunSingle(context.Background(), options)
	if err != nil || result.Stopped {
		t.Errorf("idle runner: err %v, stopped %v", err, result.Stopped)
	}
	if requests := server.Requests(); len(requests) == 0 {
		t.Error("the runner never asked for a job")
	}

	options.WaitTimeout = time.Hour
	process, err := runner.Start(options)
	if err != nil {
		t.Fatal(err)
	}
	result = process.Stop()
	if !result.Stopped {
		t.Error("Stop did not report stopping the runner")
	}
}

// TestRunnerArtifactsRoundTripThroughTheHelper uploads a job's artifacts and downloads them in
// a later job, both through the runner's helper binary (the only `gitlab-runner` on PATH).
func TestRunnerArtifactsRoundTripThroughTheHelper(t *testing.T) {
	server := newServer(t, fakegitlab.WithLongPolling(10*time.Second))
	executor := localexecutor.New(t)

	producer := server.NewJob(fakegitlab.JobSpec{
		Name:        "build",
		Script:      []string{"mkdir -p out", "echo built by the producer > out/result.txt", `echo "helper: $(command -v gitlab-runner)"`},
		GitStrategy: "none",
		Artifacts:   []fakegitlab.Artifact{{Paths: []string{"out/"}, When: fakegitlab.WhenOnSuccess, Format: "zip", Type: "archive", ExpireIn: "1 day"}},
	})
	produced := runJob(t, server, executor, producer)
	if produced.State != fakegitlab.StateSuccess || len(produced.Artifacts) != 1 {
		t.Fatalf("producer state %q with %d uploads", produced.State, len(produced.Artifacts))
	}
	if got := zipEntry(t, produced.Artifacts[0].Data, "out/result.txt"); got != "built by the producer\n" {
		t.Errorf("uploaded out/result.txt = %q", got)
	}
	for _, want := range []string{"helper: " + filepath.Join(executor.HelperDir, "gitlab-runner"), "Uploading artifacts", "201 Created"} {
		if !strings.Contains(produced.Trace, want) {
			t.Errorf("producer trace lacks %q", want)
		}
	}

	dependency, err := server.Dependency(producer.ID)
	if err != nil {
		t.Fatal(err)
	}
	consumer := server.NewJob(fakegitlab.JobSpec{
		Name:         "test",
		Script:       []string{"cat out/result.txt"},
		GitStrategy:  "none",
		Dependencies: []fakegitlab.Dependency{dependency},
	})
	consumed := runJob(t, server, executor, consumer)
	if consumed.State != fakegitlab.StateSuccess || !strings.Contains(consumed.Trace, "\nbuilt by the producer\n") {
		t.Errorf("consumer state %q did not print the downloaded artifact", consumed.State)
	}
	if !strings.Contains(consumed.Trace, "Downloading artifacts") {
		t.Error("consumer trace lacks the helper's download")
	}
}

func zipEntry(t testing.TB, archive []byte, name string) string {
	t.Helper()
	reader, err := zip.NewReader(bytes.NewReader(archive), int64(len(archive)))
	if err != nil {
		t.Fatalf("artifacts are not a zip: %v", err)
	}
	file, err := reader.Open(name)
	if err != nil {
		t.Fatalf("artifacts zip: %v", err)
	}
	defer file.Close()
	content, err := io.ReadAll(file)
	if err != nil {
		t.Fatal(err)
	}
	return string(content)
}

// BenchmarkRunnerAloneHelloJob measures the floor of the real runner: a
// `script: [echo hello]` job (GIT_STRATEGY none) from the job's hand-out
// (POST /jobs/request) to its final state (PUT success), jobs back to back
// through one runner.
//
//   - local-executor: the full local executor (config, prepare, run, cleanup)
//   - run-exec-only: only a run_exec that execs the script, the least a
//     custom executor can do
func BenchmarkRunnerAloneHelloJob(b *testing.B) {
	b.Run("local-executor", func(b *testing.B) {
		server := newServer(b, fakegitlab.WithLongPolling(30*time.Second))
		benchmarkHelloJobs(b, server, runnerOptions(b, server, localexecutor.New(b)))
	})
	b.Run("run-exec-only", func(b *testing.B) {
		server := newServer(b, fakegitlab.WithLongPolling(30*time.Second))
		dir := b.TempDir()
		runExec := filepath.Join(dir, "run")
		if err := os.WriteFile(runExec, []byte("#!/bin/sh\nexec \"$1\"\n"), 0o755); err != nil {
			b.Fatal(err)
		}
		benchmarkHelloJobs(b, server, runner.Options{
			Binary:    requireBinary(b),
			URL:       server.URL(),
			Token:     server.RunnerToken(),
			BuildsDir: filepath.Join(dir, "builds"),
			CacheDir:  filepath.Join(dir, "cache"),
			Executor:  runner.CustomExecutor{RunExec: runExec},
		})
	})
}

func benchmarkHelloJobs(b *testing.B, server *fakegitlab.Server, options runner.Options) {
	options.MaxBuilds = b.N
	process, err := runner.Start(options)
	if err != nil {
		b.Fatal(err)
	}
	defer process.Stop()

	durations := make([]time.Duration, 0, b.N)
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(b.N)*time.Minute)
	defer cancel()
	b.ResetTimer()
	for range b.N {
		jobID := server.Enqueue(server.NewJob(fakegitlab.JobSpec{Script: []string{"echo hello"}, GitStrategy: "none"}))
		result, err := server.Wait(ctx, jobID)
		if err != nil || result.State != fakegitlab.StateSuccess {
			b.Fatalf("job %d: state %q err %v\nrunner log:\n%s", jobID, result.State, err, process.Log())
		}
		durations = append(durations, result.Duration())
	}
	b.StopTimer()
	reportDurations(b, durations)
}

// reportDurations reports the median, min and max job duration in seconds.
func reportDurations(b *testing.B, durations []time.Duration) {
	sort.Slice(durations, func(i, j int) bool { return durations[i] < durations[j] })
	b.ReportMetric(durations[len(durations)/2].Seconds(), "s/job-median")
	b.ReportMetric(durations[0].Seconds(), "s/job-min")
	b.ReportMetric(durations[len(durations)-1].Seconds(), "s/job-max")
}
