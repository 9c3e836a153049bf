package runner

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestRunSingleCommandLine(t *testing.T) {
	options, err := Options{
		Binary:    "/bin/true",
		URL:       "http://127.0.0.1:1234",
		Token:     "glrt-token",
		BuildsDir: "/builds",
		Debug:     true,
		Cache:     &S3Cache{ServerAddress: "10.99.1.9", AccessKey: "AK", SecretKey: "SK", BucketName: "cache", Insecure: true},
		Executor: CustomExecutor{
			ConfigExec:          "/x/config",
			PrepareExec:         "/x/prepare",
			PrepareArgs:         []string{"one", "two words"},
			RunExec:             "/x/run",
			RunArgs:             []string{"--verbose"},
			CleanupExec:         "/x/cleanup",
			CleanupExecTimeout:  90 * time.Second,
			GracefulKillTimeout: 1500 * time.Millisecond,
		},
	}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	want := "--debug run-single --url http://127.0.0.1:1234 --token glrt-token --name sandbox-executor-test" +
		" --max-builds 1 --wait-timeout 30 --builds-dir /builds" +
		" --cache-type s3 --cache-s3-server-address 10.99.1.9 --cache-s3-access-key AK --cache-s3-secret-key SK" +
		" --cache-s3-bucket-name cache --cache-s3-insecure --executor custom" +
		" --custom-config-exec /x/config --custom-prepare-exec /x/prepare" +
		" --custom-prepare-args one --custom-prepare-args two words" +
		" --custom-run-exec /x/run --custom-run-args --verbose" +
		" --custom-cleanup-exec /x/cleanup --custom-cleanup-exec-timeout 90 --custom-graceful-kill-timeout 2"
	if got := strings.Join(options.args(), " "); got != want {
		t.Errorf("command line\n got %s\nwant %s", got, want)
	}
}

func TestOptionsNeedURLTokenAndRunExec(t *testing.T) {
	for _, options := range []Options{
		{Binary: "/bin/true", Token: "t", Executor: CustomExecutor{RunExec: "/x/run"}},
		{Binary: "/bin/true", URL: "http://127.0.0.1", Executor: CustomExecutor{RunExec: "/x/run"}},
		{Binary: "/bin/true", URL: "http://127.0.0.1", Token: "t"},
	} {
		if _, err := options.withDefaults(); err == nil {
			t.Errorf("%+v accepted", options)
		}
	}
}

func TestBinaryPathTellsHowToBuildTheRunner(t *testing.T) {
	t.Setenv(BinaryEnvVar, filepath.Join(t.TempDir(), "missing"))
	_, err := BinaryPath()
	if err == nil || !strings.Contains(err.Error(), "tests/tools/gitlab-runner/build.sh") {
		t.Errorf("error %v does not point at build.sh", err)
	}

	explicit := writeFakeBinary(t, t.TempDir())
	t.Setenv(BinaryEnvVar, explicit)
	if path, err := BinaryPath(); err != nil || path != explicit {
		t.Errorf("BinaryPath() = %q, %v; want %s", path, err, explicit)
	}

	// Without the variable, where build.sh puts it.
	cacheDir := t.TempDir()
	cached := writeFakeBinary(t, filepath.Join(cacheDir, "bin"))
	t.Setenv(BinaryEnvVar, "")
	t.Setenv("SANDBOX_EXECUTOR_CACHE", cacheDir)
	if path, err := BinaryPath(); err != nil || path != cached {
		t.Errorf("BinaryPath() = %q, %v; want %s", path, err, cached)
	}
}

func writeFakeBinary(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	binary := filepath.Join(dir, "gitlab-runner")
	if err := os.WriteFile(binary, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return binary
}

func TestEffectiveTimeoutsDefaultLikeTheRunner(t *testing.T) {
	timeouts := CustomExecutor{PrepareExecTimeout: time.Minute}.EffectiveTimeouts()
	want := Timeouts{
		ConfigExec: time.Hour, PrepareExec: time.Minute, CleanupExec: time.Hour,
		GracefulKill: 10 * time.Minute, ForceKill: 10 * time.Second,
	}
	if timeouts != want {
		t.Errorf("timeouts %+v, want %+v", timeouts, want)
	}
}
