package executor_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/gitlab"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/fakecluster"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// shellExec runs the install command with this host's /bin/sh, with the pod's BinDir mapped
// onto a temporary directory: the real script, the real coreutils. limit > 0 delivers only that
// many bytes of stdin, as a stream that ends early would.
type shellExec struct {
	binDir string
	limit  int64
	calls  int
}

func (s *shellExec) Exec(ctx context.Context, req kube.ExecRequest) error {
	s.calls++
	args := append([]string(nil), req.Command...)
	for i, a := range args {
		if a == wire.BinDir {
			args[i] = s.binDir
		}
	}
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = req.Stdin, req.Stdout, req.Stderr
	if s.limit > 0 {
		cmd.Stdin = io.LimitReader(req.Stdin, s.limit)
	}
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return &kube.ExitError{Code: exit.ExitCode()}
	}
	return err
}

var needsHelper = &gitlab.Job{ID: 1, NeedsHelper: true}

func writeHelper(t *testing.T, size int) (string, []byte) {
	t.Helper()
	data := bytes.Repeat([]byte("gitlab-runner\x00\x01"), size/15+1)[:size]
	path := filepath.Join(t.TempDir(), "gitlab-runner-linux-amd64")
	if err := os.WriteFile(path, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return path, data
}

func TestInstallHelperPutsTheBinaryOnThePodsPath(t *testing.T) {
	path, data := writeHelper(t, 3<<20)
	ex := &shellExec{binDir: filepath.Join(t.TempDir(), "bin")}
	var log bytes.Buffer
	sbx := &kube.Sandbox{Namespace: "ns", Pod: "pod-1", Container: "job"}
	if err := executor.InstallHelper(context.Background(), ex, ex, sbx, path, needsHelper, fakecluster.JobLog(&log)); err != nil {
		t.Fatal(err)
	}
	installed := filepath.Join(ex.binDir, executor.HelperName)
	got, err := os.ReadFile(installed)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("installed helper: %d bytes, %v; want the %d bytes sent", len(got), err, len(data))
	}
	if info, _ := os.Stat(installed); info.Mode().Perm() != 0o700 {
		t.Errorf("mode %v, want 0700 (executable, private)", info.Mode().Perm())
	}
	if line := log.String(); !strings.Contains(line, "Copied the runner helper ("+path+", 3.1 MB) into the pod as "+wire.BinDir+"/gitlab-runner in ") {
		t.Errorf("job log: %q", line)
	}
}

func TestInstallHelperRefusesATruncatedCopy(t *testing.T) {
	path, _ := writeHelper(t, 100000)
	ex := &shellExec{binDir: filepath.Join(t.TempDir(), "bin"), limit: 65536}
	sbx := &kube.Sandbox{Namespace: "ns", Pod: "pod-1", Container: "job"}
	err := executor.InstallHelper(context.Background(), ex, ex, sbx, path, needsHelper, fakecluster.JobLog(nil))
	if failure.KindOf(err) != failure.KindSystem || !strings.Contains(fmt.Sprint(err), "received 65536 of 100000 bytes") {
		t.Fatalf("err = %v, want a system failure (retried) saying what arrived", err)
	}
	if _, err := os.Stat(filepath.Join(ex.binDir, executor.HelperName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a truncated helper was put on PATH: %v", err)
	}
}

func TestInstallHelperOffOrMissing(t *testing.T) {
	ex := &shellExec{binDir: t.TempDir()}
	sbx := &kube.Sandbox{Namespace: "ns", Pod: "pod-1", Container: "job"}
	if err := executor.InstallHelper(context.Background(), ex, ex, sbx, "", needsHelper, fakecluster.JobLog(nil)); err != nil || ex.calls != 0 {
		t.Errorf("helper_binary unset: %v, %d execs; want nothing done", err, ex.calls)
	}
	missing := filepath.Join(t.TempDir(), "gone")
	err := executor.InstallHelper(context.Background(), ex, ex, sbx, missing, needsHelper, fakecluster.JobLog(nil))
	if failure.KindOf(err) != failure.KindPermanent || !strings.Contains(fmt.Sprint(err), missing) || ex.calls != 0 {
		t.Errorf("helper removed after config validation: %v, %d execs; want a permanent error naming it", err, ex.calls)
	}
}

// The helper is copied only into pods of jobs whose stages will call it, as far as the job JSON
// tells; runners that write none (12.x) always get it.
func TestJobsWithoutCacheOrArtifactsSkipTheHelper(t *testing.T) {
	for _, tc := range []struct {
		json string
		want bool
	}{
		{`"image":{"name":"ci"}`, false},
		{`"cache":[{"key":"k","paths":[]}],"artifacts":[{"name":"a"}],"dependencies":[{"id":7,"artifacts_file":{}}]`, false},
		{`"cache":[{"key":"deps","paths":["node_modules/"]}]`, true},
		{`"artifacts":[{"untracked":true}]`, true},
		{`"dependencies":[{"id":7,"artifacts_file":{"filename":"artifacts.zip","size":10}}]`, true},
	} {
		path := filepath.Join(t.TempDir(), "response.json")
		if err := os.WriteFile(path, []byte(`{"id":5,`+tc.json+`}`), 0o600); err != nil {
			t.Fatal(err)
		}
		job, err := gitlab.ReadJob(path)
		if err != nil || job.NeedsHelper != tc.want {
			t.Errorf("%s: NeedsHelper %v, %v; want %v", tc.json, job != nil && job.NeedsHelper, err, tc.want)
		}
	}
	job, err := gitlab.JobFromEnv(func(k string) string { return map[string]string{"CUSTOM_ENV_CI_JOB_ID": "5"}[k] })
	if err != nil || !job.NeedsHelper {
		t.Errorf("a job known only from CUSTOM_ENV_*: NeedsHelper %v, %v; want true", job != nil && job.NeedsHelper, err)
	}

	ex := &shellExec{binDir: t.TempDir()}
	path, _ := writeHelper(t, 10)
	sbx := &kube.Sandbox{Namespace: "ns", Pod: "pod-1", Container: "job"}
	if err := executor.InstallHelper(context.Background(), ex, ex, sbx, path, &gitlab.Job{ID: 5}, fakecluster.JobLog(nil)); err != nil || ex.calls != 0 {
		t.Errorf("a job without cache and artifacts: %v, %d execs; want no copy", err, ex.calls)
	}
}
