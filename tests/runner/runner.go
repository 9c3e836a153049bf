// Package runner drives the real gitlab-runner binary against a fake GitLab: it runs
// `gitlab-runner run-single` with a custom executor definition, bounds it with a timeout,
// captures the runner's own log and always stops the process it started.
//
// The runner is GitLab Runner 17.9.0, the real, unmodified binaries kept beside the repository
// in ../shared/tools/gitlab-runner-17.9.0 (resolved from the module root, so a fresh clone with
// shared/ beside it finds them): `gitlab-runner` runs the jobs, and `gitlab-runner-helper` is
// what the cache and artifacts stages call inside the job environment (the executor's
// helper_binary copies it into the pod as `gitlab-runner`). Two environment variables point
// the suites at other binaries:
//
//	SANDBOX_EXECUTOR_GITLAB_RUNNER=/path/to/gitlab-runner          the runner (default: the shared 17.9.0)
//	SANDBOX_EXECUTOR_GITLAB_RUNNER_HELPER=/path/to/gitlab-runner-helper
//	                                   the in-pod helper (default: gitlab-runner-helper beside the runner)
package runner

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
)

// BinaryEnvVar names the environment variable that points at the gitlab-runner binary.
const BinaryEnvVar = "SANDBOX_EXECUTOR_GITLAB_RUNNER"

// HelperEnvVar names the environment variable that points at the runner's helper binary, the
// one job environments run for cache and artifacts.
const HelperEnvVar = "SANDBOX_EXECUTOR_GITLAB_RUNNER_HELPER"

// DefaultVersion is the version of the shared runner binaries the suites use by default.
const DefaultVersion = "17.9.0"

// HelperBinaryName is the helper's file name beside the runner binary.
const HelperBinaryName = "gitlab-runner-helper"

// SharedDir is where the shared runner binaries are: ../shared/tools/gitlab-runner-<version>
// from the module root.
func SharedDir() (string, error) {
	root, err := testutil.ModuleRoot()
	if err != nil {
		return "", fmt.Errorf("locating gitlab-runner: %w; set %s to a gitlab-runner binary", err, BinaryEnvVar)
	}
	return filepath.Join(filepath.Dir(root), "shared", "tools", "gitlab-runner-"+DefaultVersion), nil
}

// BinaryPath finds the gitlab-runner binary: $SANDBOX_EXECUTOR_GITLAB_RUNNER, else the shared
// 17.9.0 binary (SharedDir). The error names the path it tried and the variable.
func BinaryPath() (string, error) {
	path := os.Getenv(BinaryEnvVar)
	if path == "" {
		dir, err := SharedDir()
		if err != nil {
			return "", err
		}
		path = filepath.Join(dir, "gitlab-runner")
	}
	if err := executable(path); err != nil {
		return "", fmt.Errorf("no gitlab-runner binary at %s (%v): put GitLab Runner %s in %s, "+
			"or point %s at a gitlab-runner binary", path, err, DefaultVersion, filepath.Dir(path), BinaryEnvVar)
	}
	return path, nil
}

// HelperPath finds the runner's helper binary: $SANDBOX_EXECUTOR_GITLAB_RUNNER_HELPER, else
// gitlab-runner-helper beside the runner binary (BinaryPath).
func HelperPath() (string, error) {
	path := os.Getenv(HelperEnvVar)
	if path == "" {
		binary, err := BinaryPath()
		if err != nil {
			return "", err
		}
		path = filepath.Join(filepath.Dir(binary), HelperBinaryName)
	}
	if err := executable(path); err != nil {
		return "", fmt.Errorf("no gitlab-runner helper binary at %s (%v): point %s at one", path, err, HelperEnvVar)
	}
	return path, nil
}

func executable(path string) error {
	info, err := os.Stat(path)
	switch {
	case err != nil:
		return err
	case info.IsDir():
		return errors.New("a directory")
	case info.Mode().Perm()&0o111 == 0:
		return errors.New("not executable")
	}
	return nil
}

// Version is what `binary --version` says its version is (e.g. "17.9.0").
func Version(binary string) (string, error) {
	out, err := exec.Command(binary, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", binary, err)
	}
	scanner := bufio.NewScanner(bytes.NewReader(out))
	for scanner.Scan() {
		if version, found := strings.CutPrefix(scanner.Text(), "Version:"); found {
			return strings.TrimSpace(version), nil
		}
	}
	return "", fmt.Errorf("%s --version printed no Version line:\n%s", binary, out)
}

// Options describe one `gitlab-runner run-single` process.
type Options struct {
	// Binary is the gitlab-runner to run; empty means BinaryPath().
	Binary string
	// URL and Token are the GitLab URL and runner token (--url, --token).
	URL   string
	Token string
	// Name is the runner's description (--name).
	Name string

	Executor CustomExecutor
	// BuildsDir and CacheDir are paths inside the job environment; a custom
	// executor needs them here unless its config_exec returns them.
	BuildsDir string
	CacheDir  string
	// Cache, if set, is the runner's distributed cache ([runners.cache] with Type "s3").
	Cache *S3Cache

	// MaxBuilds is how many jobs run-single processes before it exits; 0 means 1.
	MaxBuilds int
	// WaitTimeout makes run-single exit when no job came for that long;
	// 0 means 30 s. The runner only checks it between polls, which are 3 s
	// apart when GitLab answers 204 at once.
	WaitTimeout time.Duration
	// Timeout bounds the whole process; when it passes, RunSingle stops the
	// runner and fails. 0 means 3 minutes.
	Timeout time.Duration
	// StopGracePeriod is how long Stop waits after SIGTERM before it kills
	// the runner's whole process group; 0 means 10 s.
	StopGracePeriod time.Duration

	// Env is added to this process's environment for the runner, which
	// passes its environment on to every executor stage.
	Env []string
	// Debug runs the runner with --debug, logging every API call.
	Debug bool
	// LogOutput, if set, also receives the runner's own log as it is written.
	LogOutput io.Writer
}

const (
	defaultWaitTimeout     = 30 * time.Second
	defaultProcessTimeout  = 3 * time.Minute
	defaultStopGracePeriod = 10 * time.Second
	// outputDrainTimeout bounds how long Wait keeps reading the runner's
	// output after it exited, in case a stray child still holds the pipe.
	outputDrainTimeout = 2 * time.Second
)

func (o Options) withDefaults() (Options, error) {
	if o.Binary == "" {
		binary, err := BinaryPath()
		if err != nil {
			return o, err
		}
		o.Binary = binary
	}
	if o.URL == "" || o.Token == "" {
		return o, errors.New("runner: URL and Token are required")
	}
	if o.Executor.RunExec == "" {
		return o, errors.New("runner: Executor.RunExec is required")
	}
	if o.Name == "" {
		o.Name = "sandbox-executor-test"
	}
	if o.MaxBuilds <= 0 {
		o.MaxBuilds = 1
	}
	o.WaitTimeout = orDefault(o.WaitTimeout, defaultWaitTimeout)
	o.StopGracePeriod = orDefault(o.StopGracePeriod, defaultStopGracePeriod)
	return o, nil
}

// args renders the run-single command line: flags, not a config.toml.
func (o Options) args() []string {
	var args []string
	if o.Debug {
		args = append(args, "--debug")
	}
	args = append(args, "run-single",
		"--url", o.URL,
		"--token", o.Token,
		"--name", o.Name,
		"--max-builds", strconv.Itoa(o.MaxBuilds),
		"--wait-timeout", strconv.Itoa(max(1, int(o.WaitTimeout/time.Second))),
	)
	if o.BuildsDir != "" {
		args = append(args, "--builds-dir", o.BuildsDir)
	}
	if o.CacheDir != "" {
		args = append(args, "--cache-dir", o.CacheDir)
	}
	args = append(args, o.Cache.flags()...)
	return append(args, o.Executor.runSingleFlags()...)
}

// S3Cache is an S3-compatible distributed cache. The runner only signs a GET and a PUT URL for
// each cache archive; the helper binary in the job environment fetches and stores it.
type S3Cache struct {
	// ServerAddress is host[:port], without a scheme.
	ServerAddress string
	AccessKey     string
	SecretKey     string
	BucketName    string
	// Insecure signs http:// URLs instead of https://.
	Insecure bool
}

func (c *S3Cache) flags() []string {
	if c == nil {
		return nil
	}
	flags := []string{"--cache-type", "s3",
		"--cache-s3-server-address", c.ServerAddress,
		"--cache-s3-access-key", c.AccessKey,
		"--cache-s3-secret-key", c.SecretKey,
		"--cache-s3-bucket-name", c.BucketName,
	}
	if c.Insecure {
		flags = append(flags, "--cache-s3-insecure")
	}
	return flags
}

// Result is how a runner process ended.
type Result struct {
	// ExitCode is the runner's exit status; -1 if a signal ended it.
	ExitCode int
	// Log is the runner's own stdout and stderr (not the job log, which
	// went to GitLab).
	Log      string
	Duration time.Duration
	// Stopped tells that Stop had to end the process.
	Stopped bool
}

// Process is a running gitlab-runner.
type Process struct {
	cmd         *exec.Cmd
	log         *testutil.LockedBuffer
	started     time.Time
	gracePeriod time.Duration

	exited   chan struct{} // closed once cmd.Wait returned
	exitErr  error
	duration time.Duration

	stopOnce sync.Once
	stopped  atomic.Bool
}

// Start launches `gitlab-runner run-single` as described by options, in a
// process group of its own so that Stop can also reach the executor stages
// it spawned.
func Start(options Options) (*Process, error) {
	options, err := options.withDefaults()
	if err != nil {
		return nil, err
	}
	log := &testutil.LockedBuffer{}
	var output io.Writer = log
	if options.LogOutput != nil {
		output = io.MultiWriter(log, options.LogOutput)
	}

	cmd := exec.Command(options.Binary, options.args()...)
	cmd.Env = append(os.Environ(), options.Env...)
	cmd.Stdout = output
	cmd.Stderr = output
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = outputDrainTimeout
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", options.Binary, err)
	}

	process := &Process{
		cmd:         cmd,
		log:         log,
		started:     time.Now(),
		gracePeriod: options.StopGracePeriod,
		exited:      make(chan struct{}),
	}
	go func() {
		process.exitErr = cmd.Wait()
		process.duration = time.Since(process.started)
		// Executor stages a job left behind (a backgrounded command, or one
		// the runner abandoned after its force-kill timeout) are still in
		// the group: reap them.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		close(process.exited)
	}()
	return process, nil
}

// PID is the runner's process ID (and its process group ID).
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited is closed when the runner has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Log returns the runner's own log so far.
func (p *Process) Log() string { return p.log.String() }

// Wait waits for the runner to exit. If ctx ends first, it stops the runner
// and returns the result together with an error that quotes the log.
func (p *Process) Wait(ctx context.Context) (Result, error) {
	select {
	case <-p.exited:
		return p.result(), nil
	case <-ctx.Done():
		result := p.Stop()
		return result, fmt.Errorf("gitlab-runner (pid %d) still running after %v, stopped it: %w\n%s",
			p.PID(), time.Since(p.started).Round(time.Millisecond), ctx.Err(), indent(result.Log))
	}
}

// Stop ends the runner if it is still running: SIGTERM to the runner, which
// then aborts its job and cleans up, and after the grace period SIGKILL to
// its whole process group. It returns once the runner has exited.
func (p *Process) Stop() Result {
	p.stopOnce.Do(func() {
		select {
		case <-p.exited:
			return
		default:
		}
		p.stopped.Store(true)
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(p.gracePeriod):
			_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
			<-p.exited
		}
	})
	<-p.exited
	return p.result()
}

func (p *Process) result() Result {
	exitCode := 0
	var exitError *exec.ExitError
	if errors.As(p.exitErr, &exitError) {
		exitCode = exitError.ExitCode()
	} else if p.exitErr != nil {
		exitCode = -1
	}
	return Result{ExitCode: exitCode, Log: p.Log(), Duration: p.duration, Stopped: p.stopped.Load()}
}

// RunSingle runs `gitlab-runner run-single` to completion (MaxBuilds jobs, or
// WaitTimeout without a job) within options.Timeout, and stops it otherwise.
// A runner that exits non-zero is an error; the log is in both cases.
func RunSingle(ctx context.Context, options Options) (Result, error) {
	process, err := Start(options)
	if err != nil {
		return Result{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, orDefault(options.Timeout, defaultProcessTimeout))
	defer cancel()

	result, err := process.Wait(ctx)
	if err == nil && result.ExitCode != 0 {
		err = fmt.Errorf("gitlab-runner exited with status %d:\n%s", result.ExitCode, indent(result.Log))
	}
	return result, err
}

func indent(log string) string {
	return "    " + strings.ReplaceAll(strings.TrimRight(log, "\n"), "\n", "\n    ")
}
