//go:build runner

// These tests run the real gitlab-runner 12.8 binary, so they need it built:
//
//	export SANDBOX_EXECUTOR_GITLAB_RUNNER="$(tests/tools/gitlab-runner/build.sh)"
//	go test -tags runner -race ./tests/runner/...
//	go test -tags runner -run '^$' -bench . -benchtime 10x ./tests/runner/
//
// Without the binary they fail and say so. They prove the harness (fake
// GitLab + runner driver + modern protocol driver) with the local executor,
// which runs the job's scripts on this host.
package runner_test

import (
	"archive/zip"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/tests/fakegitlab"
	"github.com/sandbox-executor/sandbox-executor/tests/runner"
	"github.com/sandbox-executor/sandbox-executor/tests/runner/localexecutor"
	"github.com/sandbox-executor/sandbox-executor/tests/runner/modern"
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

// runnerOptions runs the local executor under the real runner, with the
// runner binary on PATH because the artifact stages call it inside the job
// environment, which here is this host.
func runnerOptions(t testing.TB, server *fakegitlab.Server, executor *localexecutor.Executor) runner.Options {
	binary := requireBinary(t)
	return runner.Options{
		Binary:   binary,
		URL:      server.URL(),
		Token:    server.RunnerToken(),
		Executor: executor.Definition,
		Env:      append(slices.Clone(executor.Env), "PATH="+filepath.Dir(binary)+":"+os.Getenv("PATH")),
	}
}

// runJobThroughRunner12 hands job to `gitlab-runner run-single` and waits
// for GitLab to learn the outcome.
func runJobThroughRunner12(t testing.TB, server *fakegitlab.Server, executor *localexecutor.Executor, job fakegitlab.Job) fakegitlab.Result {
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

func TestRunner12RunsHelloJobThroughLocalExecutor(t *testing.T) {
	server := newServer(t, fakegitlab.WithLongPolling(10*time.Second))
	executor := localexecutor.New(t)
	job := server.NewJob(fakegitlab.JobSpec{Image: "alpine:3.20", Script: []string{"echo hello"}, GitStrategy: "none"})

	result := runJobThroughRunner12(t, server, executor, job)

	if result.State != fakegitlab.StateSuccess {
		t.Errorf("job state %q (reason %q), want success", result.State, result.FailureReason)
	}
	if !strings.Contains(result.Trace, "\nhello\n") {
		t.Error("trace lacks the script's output")
	}
	if result.Runner.Version != "12.8.0-pre" || result.Runner.Executor != "custom" {
		t.Errorf("job taken by %+v, want gitlab-runner 12.8.0-pre with the custom executor", result.Runner)
	}
	if strings.Contains(result.Trace, "cleaned up") {
		t.Error("cleanup_exec output reached the job log")
	}
	// 12.8 passes CUSTOM_ENV_* (and CUSTOM_ENV_CI_JOB_IMAGE) but neither
	// JOB_RESPONSE_FILE, BUILD_EXIT_CODE_FILE nor config_exec's job_env.
	wantPrepare := "prepare job=" + strconv.FormatInt(job.ID, 10) + " image=alpine:3.20 response_file= exit_code_file= job_env="
	if got := executor.Event(t, "prepare"); got != wantPrepare {
		t.Errorf("prepare saw %q, want %q", got, wantPrepare)
	}
	// 12.8 calls run_exec for every stage, even those with nothing to do.
	wantEvents := []string{"config", wantPrepare, "run prepare_script", "run get_sources", "run restore_cache",
		"run download_artifacts", "run build_script", "run after_script", "run archive_cache",
		"run upload_artifacts_on_success", "cleanup"}
	if events := executor.Events(t); !slices.Equal(events, wantEvents) {
		t.Errorf("executor calls %q,\nwant %q", events, wantEvents)
	}
}

func TestRunner12ReportsFailingScript(t *testing.T) {
	server := newServer(t, fakegitlab.WithLongPolling(10*time.Second))
	executor := localexecutor.New(t)
	job := server.NewJob(fakegitlab.JobSpec{
		Script:      []string{"echo about to fail", "exit 3"},
		AfterScript: []string{"echo after script ran"},
		GitStrategy: "none",
	})

	result := runJobThroughRunner12(t, server, executor, job)

	if result.State != fakegitlab.StateFailed || result.FailureReason != "script_failure" {
		t.Errorf("job state %q reason %q, want failed/script_failure", result.State, result.FailureReason)
	}
	for _, want := range []string{"about to fail", "after script ran"} {
		if !strings.Contains(result.Trace, want) {
			t.Errorf("trace lacks %q", want)
		}
	}
	if result.ExitCode != nil {
		t.Errorf("runner 12.8 sent exit code %d, a field it does not know", *result.ExitCode)
	}
}

func TestRunner12AbortsJobCanceledInGitLab(t *testing.T) {
	server := newServer(t, fakegitlab.WithLongPolling(10*time.Second))
	executor := localexecutor.New(t)
	// 12.8 only learns of a cancel from a trace patch, sent every 3 s when
	// there is new output; a job that prints nothing is noticed after 30 s.
	job := server.NewJob(fakegitlab.JobSpec{
		Script:      []string{"echo started", "for i in $(seq 60); do echo tick; sleep 1; done"},
		GitStrategy: "none",
	})
	jobID := server.Enqueue(job)
	process, err := runner.Start(runnerOptions(t, server, executor))
	if err != nil {
		t.Fatal(err)
	}
	defer process.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := server.WaitForTrace(ctx, jobID, "started"); err != nil {
		t.Fatalf("%v\nrunner log:\n%s", err, process.Log())
	}
	canceledAt := time.Now()
	if err := server.Cancel(jobID); err != nil {
		t.Fatal(err)
	}
	result, err := server.Wait(ctx, jobID)
	if err != nil {
		t.Fatalf("%v\nrunner log:\n%s", err, process.Log())
	}
	logOnFailure(t, process.Log(), result.Trace)

	// 12.8 has no job_canceled failure reason: it reports a script failure.
	if result.State != fakegitlab.StateCanceled || result.ReportedState != fakegitlab.StateFailed || result.FailureReason != "script_failure" {
		t.Errorf("state %q reported %q (%q), want canceled, reported failed (script_failure)", result.State, result.ReportedState, result.FailureReason)
	}
	// Up to 3 s until the next trace patch tells the runner, then SIGTERM.
	elapsed := result.FinishedAt.Sub(canceledAt)
	t.Logf("cancel to final state: %v", elapsed)
	if elapsed > 10*time.Second {
		t.Errorf("runner took %v to act on the cancel", elapsed)
	}
	if _, err := process.Wait(ctx); err != nil {
		t.Error(err)
	}
	if executor.Event(t, "cleanup") == "" {
		t.Error("cleanup_exec was not called after the cancel")
	}
}

func TestRunSingleExitsWhenNoJobArrivesAndStopEndsARunner(t *testing.T) {
	server := newServer(t) // no long polling: 12.8 re-polls every 3 s
	executor := localexecutor.New(t)

	options := runnerOptions(t, server, executor)
	options.WaitTimeout = time.Second
	result, err := runner.RunSingle(context.Background(), options)
	if err != nil || result.Stopped {
		t.Errorf("idle runner: err %v, stopped %v", err, result.Stopped)
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

func TestRunner12ArtifactsRoundTripThroughFakeGitLab(t *testing.T) {
	server := newServer(t, fakegitlab.WithLongPolling(10*time.Second))
	executor := localexecutor.New(t)

	producer := server.NewJob(fakegitlab.JobSpec{
		Name:        "build",
		Script:      []string{"mkdir -p out", "echo built by the producer > out/result.txt"},
		GitStrategy: "none",
		Artifacts:   []fakegitlab.Artifact{{Paths: []string{"out/"}, When: fakegitlab.WhenOnSuccess, Format: "zip", Type: "archive", ExpireIn: "1 day"}},
	})
	produced := runJobThroughRunner12(t, server, executor, producer)
	if produced.State != fakegitlab.StateSuccess || len(produced.Artifacts) != 1 {
		t.Fatalf("producer state %q with %d uploads", produced.State, len(produced.Artifacts))
	}
	if got := zipEntry(t, produced.Artifacts[0].Data, "out/result.txt"); got != "built by the producer\n" {
		t.Errorf("uploaded out/result.txt = %q", got)
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
	consumed := runJobThroughRunner12(t, server, executor, consumer)
	if consumed.State != fakegitlab.StateSuccess || !strings.Contains(consumed.Trace, "\nbuilt by the producer\n") {
		t.Errorf("consumer state %q did not print the downloaded artifact", consumed.State)
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

func modernConfig(executor *localexecutor.Executor) modern.Config {
	return modern.Config{Executor: executor.Definition, ProcessEnv: append(os.Environ(), executor.Env...)}
}

func TestModernDriverRunsHelloAndFailingJobs(t *testing.T) {
	for name, tc := range map[string]struct {
		script    []string
		wantState string
		wantText  string
	}{
		"hello":   {[]string{"echo hello"}, "success", "\nhello\n"},
		"failing": {[]string{"echo failing now", "false"}, "failed", "failing now"},
	} {
		t.Run(name, func(t *testing.T) {
			executor := localexecutor.New(t)
			job := fakegitlab.NewJob(fakegitlab.JobSpec{Script: tc.script, GitStrategy: "none"})
			result, err := modern.Run(context.Background(), modernConfig(executor), job)
			if err != nil {
				t.Fatal(err)
			}
			if result.State != tc.wantState || !strings.Contains(result.Log, tc.wantText) {
				t.Errorf("state %q, want %q with %q in the log:\n%s", result.State, tc.wantState, tc.wantText, result.Log)
			}
		})
	}
}

func TestModernDriverUploadsArtifactsWithTheRealRunnerHelper(t *testing.T) {
	server := newServer(t)
	executor := localexecutor.New(t)
	job := server.NewJob(fakegitlab.JobSpec{
		Script:      []string{"mkdir -p out", "echo modern > out/result.txt"},
		GitStrategy: "none",
		Artifacts:   []fakegitlab.Artifact{{Paths: []string{"out/"}, When: fakegitlab.WhenOnSuccess}},
	})
	server.Enqueue(job)
	if err := server.HandOut(job.ID, fakegitlab.RunnerVersion{Name: "modern-driver"}); err != nil {
		t.Fatal(err)
	}
	config := modernConfig(executor)
	config.RunnerCommand = requireBinary(t)

	result, err := modern.Run(context.Background(), config, job)
	if err != nil {
		t.Fatal(err)
	}
	if result.State != "success" {
		t.Fatalf("state %q: %v\n%s", result.State, result.Err, result.Log)
	}
	snapshot, _ := server.Snapshot(job.ID)
	if len(snapshot.Artifacts) != 1 || zipEntry(t, snapshot.Artifacts[0].Data, "out/result.txt") != "modern\n" {
		t.Errorf("fake GitLab got artifacts %+v", snapshot.Artifacts)
	}
}

// BenchmarkRunnerAloneHelloJob measures the floor of the real runner: a
// `script: [echo hello]` job (GIT_STRATEGY none) through gitlab-runner 12.8,
// from the job's hand-out (POST /jobs/request) to its final state (PUT
// success), jobs back to back through one runner. The peer baseline measured
// 0.23 s median with runner 17.9 (which skips the 4 empty stages 12.8 runs).
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

// BenchmarkModernDriverHelloJob is the same job through the modern protocol
// driver: the floor of the 17.x protocol (5 executable calls fewer than 12.8).
func BenchmarkModernDriverHelloJob(b *testing.B) {
	executor := localexecutor.New(b)
	config := modernConfig(executor)
	durations := make([]time.Duration, 0, b.N)
	for range b.N {
		job := fakegitlab.NewJob(fakegitlab.JobSpec{Script: []string{"echo hello"}, GitStrategy: "none"})
		result, err := modern.Run(context.Background(), config, job)
		if err != nil || result.State != "success" {
			b.Fatalf("state %v err %v", result, err)
		}
		durations = append(durations, result.Duration)
	}
	reportDurations(b, durations)
}

// reportDurations reports the median, min and max job duration in seconds.
func reportDurations(b *testing.B, durations []time.Duration) {
	sort.Slice(durations, func(i, j int) bool { return durations[i] < durations[j] })
	b.ReportMetric(durations[len(durations)/2].Seconds(), "s/job-median")
	b.ReportMetric(durations[0].Seconds(), "s/job-min")
	b.ReportMetric(durations[len(durations)-1].Seconds(), "s/job-max")
}
