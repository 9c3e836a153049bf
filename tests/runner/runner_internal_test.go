package runner

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
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

func TestBinaryPathDefaultsToTheSharedRunnerBesideTheModule(t *testing.T) {
	t.Setenv(BinaryEnvVar, "")
	t.Setenv(HelperEnvVar, "")
	shared, err := SharedDir()
	if err != nil {
		t.Fatal(err)
	}
	root, err := testutil.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(filepath.Dir(root), "shared", "tools", "gitlab-runner-"+DefaultVersion); shared != want {
		t.Errorf("SharedDir() = %s, want %s", shared, want)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Errorf("module root %s has no go.mod: %v", root, err)
	}
	// Whether or not the shared binaries are on this machine, the default points there.
	path, err := BinaryPath()
	if err == nil && path != filepath.Join(shared, "gitlab-runner") {
		t.Errorf("BinaryPath() = %s, want the shared runner in %s", path, shared)
	}
	if err != nil && !strings.Contains(err.Error(), filepath.Join(shared, "gitlab-runner")) {
		t.Errorf("error %v does not name the shared runner's path", err)
	}
}

func TestBinaryAndHelperPathFollowTheirVariables(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	t.Setenv(BinaryEnvVar, missing)
	if _, err := BinaryPath(); err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), BinaryEnvVar) {
		t.Errorf("error %v does not name %s and %s", err, missing, BinaryEnvVar)
	}

	dir := t.TempDir()
	explicit := writeFakeBinary(t, dir, "gitlab-runner")
	t.Setenv(BinaryEnvVar, explicit)
	if path, err := BinaryPath(); err != nil || path != explicit {
		t.Errorf("BinaryPath() = %q, %v; want %s", path, err, explicit)
	}
	// The helper defaults to gitlab-runner-helper beside the runner...
	t.Setenv(HelperEnvVar, "")
	if _, err := HelperPath(); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, HelperBinaryName)) {
		t.Errorf("HelperPath() without a helper beside the runner: %v", err)
	}
	beside := writeFakeBinary(t, dir, HelperBinaryName)
	if path, err := HelperPath(); err != nil || path != beside {
		t.Errorf("HelperPath() = %q, %v; want %s", path, err, beside)
	}
	// ... unless its own variable says otherwise.
	own := writeFakeBinary(t, t.TempDir(), "my-helper")
	t.Setenv(HelperEnvVar, own)
	if path, err := HelperPath(); err != nil || path != own {
		t.Errorf("HelperPath() = %q, %v; want %s", path, err, own)
	}
}

func TestVersionParsesTheRunnersVersionOutput(t *testing.T) {
	dir := t.TempDir()
	binary := filepath.Join(dir, "gitlab-runner")
	script := "#!/bin/sh\nprintf 'Version:      17.9.0\\nGit revision: c4cbe9dd\\n'\n"
	if err := os.WriteFile(binary, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if version, err := Version(binary); err != nil || version != "17.9.0" {
		t.Errorf("Version() = %q, %v; want 17.9.0", version, err)
	}
}

func writeFakeBinary(t *testing.T, dir, name string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	binary := filepath.Join(dir, name)
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
