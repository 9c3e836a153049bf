// Package app wires the command line onto the stages. It is the one place where a failure
// becomes an exit code.
package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/urfave/cli/v2"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/sandbox-executor/sandbox-executor/buildinfo"
	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/gitlab"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/operator"
	"github.com/sandbox-executor/sandbox-executor/operator/doctor"
	"github.com/sandbox-executor/sandbox-executor/operator/exporter"
	"github.com/sandbox-executor/sandbox-executor/operator/gc"
	"github.com/sandbox-executor/sandbox-executor/operator/tlsinit"
	"github.com/sandbox-executor/sandbox-executor/runnerstart"
	"github.com/sandbox-executor/sandbox-executor/stages"
	"github.com/sandbox-executor/sandbox-executor/stages/cleanup"
	"github.com/sandbox-executor/sandbox-executor/stages/configure"
	"github.com/sandbox-executor/sandbox-executor/stages/prepare"
	"github.com/sandbox-executor/sandbox-executor/stages/run"
)

// Main runs the command line and exits.
func Main() {
	silenceClientLogs()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := Run(ctx, os.Args, os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// Deps lets tests replace the cluster connection, and the stage server run a stage it was handed.
type Deps struct {
	Clients func(*config.Config) (*kube.Clients, error)
	// Environ is the stage's whole environment, handed to the stage server (os.Environ if nil).
	Environ func() []string
	// Started is when the stage's process started, if not now (a stage the server runs).
	Started time.Time
	// Served: this is the stage server running the stage, which it must not hand on again.
	Served bool
}

// Run runs the command line with the given streams and environment and returns the exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	return RunWith(ctx, args, stdout, stderr, getenv, Deps{Clients: kube.NewClients, Environ: os.Environ})
}

// RunWith is Run with replaceable dependencies.
func RunWith(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string, deps Deps) int {
	started := deps.Started
	if started.IsZero() {
		started = time.Now()
	}
	runnerEnv := gitlab.RunnerEnvFrom(getenv)
	newEnv := func(c *cli.Context) (*stages.Env, error) {
		cfg, err := config.Load(config.ResolvePath(c.String("config"), getenv))
		if err != nil {
			return nil, failure.PermanentError(err, "")
		}
		return &stages.Env{
			Config:  cfg,
			Runner:  runnerEnv,
			Version: buildinfo.Version,
			Stdout:  stdout,
			Stderr:  stderr,
			Getenv:  getenv,
			Clients: func() (*kube.Clients, error) { return deps.Clients(cfg) },
			Clock:   clock.RealClock{},
			Started: started,
		}, nil
	}
	actionRan := false
	var stage operator.Setup = func(fn func(*cli.Context, *stages.Env) error) cli.ActionFunc {
		return func(c *cli.Context) error {
			actionRan = true
			env, err := newEnv(c)
			if err != nil {
				return err
			}
			if handled, err := forwardStage(c, env, deps); handled {
				return err
			}
			return fn(c, env)
		}
	}
	// A verb that needs no config still counts as having run: its errors are its own, not usage.
	ran := func(cmd *cli.Command) *cli.Command {
		action := cmd.Action
		cmd.Action = func(c *cli.Context) error {
			actionRan = true
			return action(c)
		}
		return cmd
	}
	app := &cli.App{
		Name:      "sandbox-executor",
		Usage:     "GitLab Runner custom executor: every job in a gVisor pod claimed from an agent-sandbox warm pool",
		Version:   buildinfo.Version,
		Writer:    stdout,
		ErrWriter: stderr,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", Usage: "config file (default $" + config.EnvVar + ", else " + config.DefaultPath + ")"},
		},
		Commands: []*cli.Command{
			{
				Name:   "config",
				Usage:  "config_exec: print the runner's ConfigExecOutput JSON",
				Action: stage(func(_ *cli.Context, env *stages.Env) error { return configure.Run(env) }),
			},
			{
				Name:   "prepare",
				Usage:  "prepare_exec: claim a gVisor sandbox for the job and wait until it is ready",
				Action: stage(func(c *cli.Context, env *stages.Env) error { return prepare.Run(c.Context, env) }),
			},
			{
				Name:      "run",
				Usage:     "run_exec: run one stage script in the job's sandbox",
				ArgsUsage: "SCRIPT STAGE",
				Action: stage(func(c *cli.Context, env *stages.Env) error {
					if c.NArg() != 2 {
						return failure.PermanentError(nil, "run takes 2 arguments, SCRIPT and STAGE; got %d", c.NArg())
					}
					return run.Run(c.Context, env, c.Args().Get(0), c.Args().Get(1))
				}),
			},
			gc.Command(stage),
			doctor.Command(stage),
			exporter.Command(stage),
			serveCommand(stage, deps, stderr),
			ran(runnerstart.Command(stdout, stderr, func(socket string) (func(context.Context) error, error) {
				// The executor config the runner's stages use (SANDBOX_EXECUTOR_CONFIG in the
				// chart), to connect ahead of the first job; without it, at the first stage.
				warm, err := config.Load(config.ResolvePath("", getenv))
				if err != nil {
					fmt.Fprintf(stderr, "start-runner: stage server: %s; it connects at the first stage\n", failure.OneLine(err.Error()))
				}
				return StageServer(socket, runnerstart.StageServerDrain, deps, stderr, warm)
			})),
			tlsinit.Command(),
			{
				Name:   "cleanup",
				Usage:  "cleanup_exec: release the job's sandbox",
				Action: stage(func(c *cli.Context, env *stages.Env) error { return cleanup.Run(c.Context, env) }),
			},
		},
		// One line, not the whole help page: these errors land in job logs.
		OnUsageError: func(_ *cli.Context, err error, _ bool) error { return err },
		// Exit codes are decided below, from the error's kind, not by the CLI library.
		ExitErrHandler: func(*cli.Context, error) {},
	}
	err := app.RunContext(ctx, args)
	var served exitStatus
	if errors.As(err, &served) {
		return int(served)
	}
	if err != nil && !actionRan {
		// A misconfigured runner (bad run_args) will not get better by retrying.
		err = failure.PermanentError(err, "usage")
	}
	return runnerEnv.Report(stderr, err)
}

// silenceClientLogs keeps client-go's own log lines (klog) out of job logs: what matters reaches
// the job as our errors, one line each. klog writes errors to stderr unless told otherwise.
func silenceClientLogs() {
	flags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(flags)
	for name, value := range map[string]string{"logtostderr": "false", "alsologtostderr": "false", "stderrthreshold": "FATAL"} {
		_ = flags.Set(name, value)
	}
	klog.SetOutput(io.Discard)
	klog.SetLogger(logr.Discard())
}
