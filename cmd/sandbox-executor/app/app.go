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
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/urfave/cli/v2"
	"k8s.io/klog/v2"

	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/stages"
	"github.com/sandbox-executor/sandbox-executor/stages/cleanup"
	"github.com/sandbox-executor/sandbox-executor/stages/configure"
	"github.com/sandbox-executor/sandbox-executor/stages/doctor"
	"github.com/sandbox-executor/sandbox-executor/stages/gc"
	"github.com/sandbox-executor/sandbox-executor/stages/prepare"
	"github.com/sandbox-executor/sandbox-executor/stages/run"
)

// Version is set at build time (-ldflags "-X .../app.Version=...").
var Version = "dev"

// Main runs the command line and exits.
func Main() {
	silenceClientLogs()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := Run(ctx, os.Args, os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// Deps lets tests replace the cluster connection.
type Deps struct {
	Clients func(*config.Config) (*executor.Clients, error)
}

// Run runs the command line with the given streams and environment and returns the exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	return RunWith(ctx, args, stdout, stderr, getenv, Deps{Clients: executor.NewClients})
}

// RunWith is Run with replaceable dependencies.
func RunWith(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string, deps Deps) int {
	started := time.Now()
	runnerEnv := executor.RunnerEnvFrom(getenv)
	newEnv := func(c *cli.Context) (*stages.Env, error) {
		cfg, err := config.Load(config.ResolvePath(c.String("config"), getenv))
		if err != nil {
			return nil, executor.PermanentError(err, "")
		}
		return &stages.Env{
			Config:  cfg,
			Runner:  runnerEnv,
			Version: Version,
			Stdout:  stdout,
			Stderr:  stderr,
			Getenv:  getenv,
			Clients: func() (*executor.Clients, error) { return deps.Clients(cfg) },
			Started: started,
		}, nil
	}
	actionRan := false
	stage := func(fn func(*cli.Context, *stages.Env) error) cli.ActionFunc {
		return func(c *cli.Context) error {
			actionRan = true
			env, err := newEnv(c)
			if err != nil {
				return err
			}
			return fn(c, env)
		}
	}
	app := &cli.App{
		Name:      "sandbox-executor",
		Usage:     "GitLab Runner custom executor: every job in a gVisor pod claimed from an agent-sandbox warm pool",
		Version:   Version,
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
						return executor.PermanentError(nil, "run takes 2 arguments, SCRIPT and STAGE; got %d", c.NArg())
					}
					return run.Run(c.Context, env, c.Args().Get(0), c.Args().Get(1))
				}),
			},
			{
				Name:  "gc",
				Usage: "report (or with --delete, delete) this runner's claims whose jobs must be over",
				Flags: []cli.Flag{
					&cli.BoolFlag{Name: "delete", Usage: "delete them; without it gc only reports"},
					&cli.DurationFlag{Name: "older-than", Usage: "also reap claims older than this, whatever their shutdownTime"},
				},
				Action: stage(func(c *cli.Context, env *stages.Env) error {
					return gc.Run(c.Context, env, gc.Options{Delete: c.Bool("delete"), OlderThan: c.Duration("older-than")})
				}),
			},
			{
				Name:  "doctor",
				Usage: "check the cluster before use: CRDs, RBAC, RuntimeClasses, pools and their templates (exit 1 on any FAIL)",
				Flags: []cli.Flag{
					&cli.BoolFlag{Name: "kubelet", Usage: "also read every node's kubelet podPidsLimit (needs cluster-admin credentials)"},
				},
				Action: stage(func(c *cli.Context, env *stages.Env) error {
					return doctor.Run(c.Context, env, doctor.Options{Kubelet: c.Bool("kubelet")})
				}),
			},
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
	if err != nil && !actionRan {
		// A misconfigured runner (bad run_args) will not get better by retrying.
		err = executor.PermanentError(err, "usage")
	}
	if err != nil && executor.KindOf(err) != executor.KindBuild {
		fmt.Fprintf(stderr, "sandbox-executor: ERROR: %s\n", oneLine(err))
	}
	return ExitCode(err, runnerEnv)
}

// ExitCode maps a stage's outcome onto the runner's protocol: script failures and permanent
// errors are build failures (not retried), everything else is a system failure (retried).
func ExitCode(err error, env executor.RunnerEnv) int {
	if err == nil {
		return 0
	}
	switch executor.KindOf(err) {
	case executor.KindBuild, executor.KindPermanent:
		return env.BuildFailureExitCode
	default:
		return env.SystemFailureExitCode
	}
}

func oneLine(err error) string {
	msg := err.Error()
	var ee *executor.Error
	if errors.As(err, &ee) && ee.Msg == "" && ee.Err != nil {
		msg = ee.Err.Error()
	}
	msg = strings.TrimSuffix(msg, ": ")
	if i := strings.IndexAny(msg, "\r\n"); i >= 0 {
		msg = msg[:i]
	}
	return msg
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
