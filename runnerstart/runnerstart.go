// Package runnerstart implements the start-runner command, the entrypoint of the runner image:
// it registers gitlab-runner with GitLab (retrying with backoff: GitLab or the network may not be
// there yet when the pod starts), then runs it, turning the pod's SIGTERM into gitlab-runner's
// graceful SIGQUIT so running jobs finish. It needs no shell, so the image has none.
package runnerstart

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"

	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/internal/environ"
)

// TokenEnv carries the runner authentication token to `gitlab-runner register`, which reads it
// from there; it is removed from the environment of `gitlab-runner run`, so job stages (which
// inherit the runner's environment) never see it.
const TokenEnv = "CI_SERVER_TOKEN"

// Options is what Run needs.
type Options struct {
	// GitLabRunner is the gitlab-runner binary.
	GitLabRunner string
	// GlobalConfig is gitlab-runner's global section; it is copied to ConfigFile before each
	// registration attempt, which appends the [[runners]] entry from Template.
	GlobalConfig, Template, ConfigFile string
	WorkingDirectory                   string
	// Backoff spaces registration attempts; Steps is the number of attempts.
	Backoff wait.Backoff
	Clock   clock.Clock
	Environ []string
	Stdout  io.Writer
	Stderr  io.Writer
	// StageServer, when set, starts the stage server (sandbox-executor serve) in this process
	// before gitlab-runner runs and stops it after gitlab-runner has exited: it must see the
	// runner's files (job JSON, state), and outlive the jobs a graceful stop lets finish.
	StageServer func() (serve func(context.Context) error, err error)
}

// StageServerDrain bounds the stages still running when the stage server stops: none should
// be, since it stops after gitlab-runner.
const StageServerDrain = 10 * time.Second

// ServeStages listens on a stage server socket and returns its serving loop.
type ServeStages func(socket string) (serve func(context.Context) error, err error)

// defaultBackoff tries for about ten minutes before the pod restarts (and the kubelet's own
// backoff takes over).
var defaultBackoff = wait.Backoff{Duration: 5 * time.Second, Factor: 2, Jitter: 0.1, Steps: 8, Cap: 2 * time.Minute}

// Command is the start-runner verb.
func Command(stdout, stderr io.Writer, serveStages ServeStages) *cli.Command {
	return &cli.Command{
		Name:  "start-runner",
		Usage: "runner image entrypoint: gitlab-runner register (retried with backoff), then gitlab-runner run",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "gitlab-runner", Value: "gitlab-runner", Usage: "the gitlab-runner binary"},
			&cli.StringFlag{Name: "global-config", Value: "/etc/gitlab-runner-templates/runner-global.toml", Usage: "gitlab-runner's global section"},
			&cli.StringFlag{Name: "template-config", Value: "/etc/gitlab-runner-templates/runner-template.toml", Usage: "the [[runners]] template for register"},
			&cli.StringFlag{Name: "config-file", Value: "/home/nonroot/.gitlab-runner/config.toml", Usage: "the config.toml written and run"},
			&cli.StringFlag{Name: "working-directory", Value: "/home/nonroot", Usage: "gitlab-runner's working directory"},
			&cli.IntFlag{Name: "register-attempts", Value: defaultBackoff.Steps, Usage: "registration attempts before giving up"},
			&cli.StringFlag{Name: "stage-server", Usage: "also serve the executor's stages on this Unix socket (stage_server in the executor's config) while gitlab-runner runs"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				// A flag after an argument is not parsed: refuse rather than run without it.
				return failure.PermanentError(nil, "start-runner takes no arguments, got %q: flags go before anything else (the runner image's entrypoint already names start-runner)", c.Args().Slice())
			}
			backoff := defaultBackoff
			backoff.Steps = c.Int("register-attempts")
			var stageServer func() (func(context.Context) error, error)
			if socket := c.String("stage-server"); socket != "" {
				stageServer = func() (func(context.Context) error, error) { return serveStages(socket) }
			}
			return Run(c.Context, Options{
				StageServer:      stageServer,
				GitLabRunner:     c.String("gitlab-runner"),
				GlobalConfig:     c.String("global-config"),
				Template:         c.String("template-config"),
				ConfigFile:       c.String("config-file"),
				WorkingDirectory: c.String("working-directory"),
				Backoff:          backoff,
				Clock:            clock.RealClock{},
				Environ:          os.Environ(),
				Stdout:           stdout,
				Stderr:           stderr,
			})
		},
	}
}

// Run registers, then runs gitlab-runner until ctx ends (SIGTERM) and it has stopped gracefully.
func Run(ctx context.Context, o Options) error {
	if environ.Lookup(o.Environ, TokenEnv) == "" {
		return failure.PermanentError(nil, "start-runner: %s is empty: mount the runner authentication token from the Secret's key runner-token", TokenEnv)
	}
	if o.Backoff.Steps < 1 {
		return failure.PermanentError(nil, "start-runner: --register-attempts must be at least 1")
	}
	if err := register(ctx, o); err != nil {
		return err
	}
	return run(ctx, o)
}

func register(ctx context.Context, o Options) error {
	backoff := o.Backoff
	attempts := backoff.Steps
	for attempt := 1; ; attempt++ {
		err := registerOnce(ctx, o)
		if err == nil {
			return nil
		}
		if attempt >= attempts || ctx.Err() != nil {
			return failure.SystemError(err, "start-runner: gitlab-runner register failed %d times, giving up", attempt)
		}
		delay := backoff.Step()
		fmt.Fprintf(o.Stderr, "start-runner: gitlab-runner register failed (attempt %d of %d: %s); next attempt in %s\n", attempt, attempts, err, delay.Round(time.Second))
		select {
		case <-ctx.Done():
			return failure.SystemError(ctx.Err(), "start-runner: stopped while waiting to register")
		case <-o.Clock.After(delay):
		}
	}
}

// registerOnce starts from the global section each time: register appends to the file.
func registerOnce(ctx context.Context, o Options) error {
	global, err := os.ReadFile(o.GlobalConfig)
	if err != nil {
		return failure.PermanentError(err, "start-runner")
	}
	if err := os.MkdirAll(filepath.Dir(o.ConfigFile), 0o700); err != nil {
		return failure.PermanentError(err, "start-runner")
	}
	if err := os.WriteFile(o.ConfigFile, global, 0o600); err != nil {
		return failure.PermanentError(err, "start-runner")
	}
	cmd := exec.CommandContext(ctx, o.GitLabRunner, "register", "--non-interactive", "--config", o.ConfigFile,
		"--template-config", o.Template, "--executor", "custom")
	cmd.Env, cmd.Stdout, cmd.Stderr = o.Environ, o.Stdout, o.Stderr
	return cmd.Run()
}

func run(ctx context.Context, o Options) error {
	if o.StageServer != nil {
		serve, err := o.StageServer()
		if err != nil {
			return failure.PermanentError(err, "start-runner")
		}
		// Not ctx: the stages of the jobs that a graceful stop lets finish still need it.
		serverCtx, stopServer := context.WithCancel(context.WithoutCancel(ctx))
		served := make(chan struct{})
		go func() {
			defer close(served)
			if err := serve(serverCtx); err != nil {
				// At once, not at the end: until then stages run in their own processes.
				fmt.Fprintf(o.Stderr, "start-runner: the stage server stopped: %s; stages run in their own processes\n", err)
			}
		}()
		defer func() {
			stopServer()
			<-served
		}()
	}
	cmd := exec.Command(o.GitLabRunner, "run", "--config", o.ConfigFile, "--working-directory", o.WorkingDirectory)
	cmd.Env, cmd.Stdout, cmd.Stderr = environ.Without(o.Environ, TokenEnv), o.Stdout, o.Stderr
	if err := cmd.Start(); err != nil {
		return failure.PermanentError(err, "start-runner")
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		return exitError(err)
	case <-ctx.Done():
	}
	// SIGQUIT: stop taking jobs, let the running ones finish, then exit; the pod's
	// terminationGracePeriodSeconds bounds how long that may take.
	fmt.Fprintln(o.Stderr, "start-runner: stopping gitlab-runner gracefully (SIGQUIT): running jobs finish first")
	if err := cmd.Process.Signal(syscall.SIGQUIT); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return failure.SystemError(err, "start-runner")
	}
	return exitError(<-exited)
}

func exitError(err error) error {
	if err == nil {
		return nil
	}
	return failure.SystemError(err, "start-runner: gitlab-runner run")
}
