// Package app is the command line of sandbox-executor: it parses the arguments, builds a verb's
// Env and runs the verb; what the verbs do lives in their packages (stages/*, operator/*,
// runnerstart, stagehost). It is the one place where a failure becomes an exit code.
package app

import (
	"context"
	"errors"
	"flag"
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
	"github.com/sandbox-executor/sandbox-executor/stages"
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

// RunWith is Run with replaceable dependencies. Every error, the command line's own included,
// ends as one line and the exit code of its kind (gitlab.RunnerEnv.Report).
func RunWith(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string, deps Deps) int {
	if deps.Started.IsZero() {
		deps.Started = time.Now()
	}
	if deps.Environ == nil {
		deps.Environ = os.Environ
	}
	inv := &invocation{deps: deps, getenv: getenv, stdout: stdout, stderr: stderr}
	err := inv.app().RunContext(ctx, args)
	var served exitStatus
	if errors.As(err, &served) {
		return int(served)
	}
	return gitlab.RunnerEnvFrom(getenv).Report(stderr, err)
}

// invocation is one run of the command line: what its verbs are given.
type invocation struct {
	deps           Deps
	getenv         func(string) string
	stdout, stderr io.Writer
}

// setup is the stages.Setup of this invocation: it loads the config, builds the Env and hands
// prepare and cleanup to the stage server when the config names one.
func (inv *invocation) setup(run func(*cli.Context, *stages.Env) error) cli.ActionFunc {
	return func(c *cli.Context) error {
		env, err := inv.env(c)
		if err != nil {
			return err
		}
		if handled, err := forwardStage(c, env, inv.deps); handled {
			return err
		}
		return run(c, env)
	}
}

func (inv *invocation) env(c *cli.Context) (*stages.Env, error) {
	cfg, err := config.Load(config.ResolvePath(c.String("config"), inv.getenv))
	if err != nil {
		return nil, failure.PermanentError(err, "")
	}
	return &stages.Env{
		Config:  cfg,
		Runner:  gitlab.RunnerEnvFrom(inv.getenv),
		Version: buildinfo.Version,
		Stdout:  inv.stdout,
		Stderr:  inv.stderr,
		Getenv:  inv.getenv,
		Clients: func() (*kube.Clients, error) { return inv.deps.Clients(cfg) },
		Clock:   clock.RealClock{},
		Started: inv.deps.Started,
	}, nil
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
