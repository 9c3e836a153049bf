package app

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/sandbox-executor/sandbox-executor/buildinfo"
	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/kube"
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

// app is the command line: the runner's stages in protocol order, then the operator's verbs.
func (inv *invocation) app() *cli.App {
	app := &cli.App{
		Name:      "sandbox-executor",
		Usage:     "GitLab Runner custom executor: every job in a gVisor pod claimed from an agent-sandbox warm pool",
		Version:   buildinfo.Version,
		Writer:    inv.stdout,
		ErrWriter: inv.stderr,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", Usage: "config file (default $" + config.EnvVar + ", else " + config.DefaultPath + ")"},
		},
		Commands: []*cli.Command{
			{
				Name:   "config",
				Usage:  "config_exec: print the runner's ConfigExecOutput JSON",
				Action: inv.setup(func(_ *cli.Context, env *stages.Env) error { return configure.Run(env) }),
			},
			{
				Name:   "prepare",
				Usage:  "prepare_exec: claim a gVisor sandbox for the job and wait until it is ready",
				Action: inv.setup(func(c *cli.Context, env *stages.Env) error { return prepare.Run(kube.RetryForbidden(c.Context), env) }),
			},
			{
				Name:      "run",
				Usage:     "run_exec: run one stage script in the job's sandbox",
				ArgsUsage: "SCRIPT STAGE",
				Action: inv.setup(func(c *cli.Context, env *stages.Env) error {
					if c.NArg() != 2 {
						return failure.PermanentError(nil, "run takes 2 arguments, SCRIPT and STAGE; got %d", c.NArg())
					}
					return run.Run(kube.RetryForbidden(c.Context), env, c.Args().Get(0), c.Args().Get(1))
				}),
			},
			{
				Name:   "cleanup",
				Usage:  "cleanup_exec: release the job's sandbox",
				Action: inv.setup(func(c *cli.Context, env *stages.Env) error { return cleanup.Run(kube.RetryForbidden(c.Context), env) }),
			},
			inv.serveCommand(),
			runnerstart.Command(inv.stdout, inv.stderr, inv.runnerStageServer),
			gc.Command(inv.setup),
			doctor.Command(inv.setup),
			exporter.Command(inv.setup),
			tlsinit.Command(),
			{
				Name:  "version",
				Usage: "print the version (as --version)",
				Action: func(c *cli.Context) error {
					cli.ShowVersion(c)
					return nil
				},
			},
		},
		Action: unknownCommand,
	}
	oneLineUsageErrors(app)
	return app
}

// runnerStageServer is start-runner's stage server, on the executor config the runner's stages
// use (SANDBOX_EXECUTOR_CONFIG in the chart) to connect ahead of the first job; without it, at
// the first stage.
func (inv *invocation) runnerStageServer(socket string) (func(context.Context) error, error) {
	warm, err := config.Load(config.ResolvePath("", inv.getenv))
	if err != nil {
		fmt.Fprintf(inv.stderr, "start-runner: stage server: %s; it connects at the first stage\n", failure.OneLine(err.Error()))
	}
	return inv.stageServer(socket, runnerstart.StageServerDrain, warm)
}

// oneLineUsageErrors makes every usage error one line naming the fix instead of the whole help
// page (these errors land in job logs), and a permanent error: a misconfigured runner (bad
// run_args) will not get better by retrying. Commands that only group others refuse unknown
// ones the same way.
func oneLineUsageErrors(app *cli.App) {
	app.OnUsageError = usageError
	var walk func([]*cli.Command)
	walk = func(commands []*cli.Command) {
		for _, cmd := range commands {
			cmd.OnUsageError = usageError
			if cmd.Action == nil && len(cmd.Subcommands) > 0 {
				cmd.Action = unknownCommand
			}
			walk(cmd.Subcommands)
		}
	}
	walk(app.Commands)
	// Exit codes are decided by RunWith, from the error's kind, not by the CLI library.
	app.ExitErrHandler = func(*cli.Context, error) {}
}

// usageError is a flag the command line could not parse.
func usageError(c *cli.Context, err error, _ bool) error {
	name := strings.TrimPrefix(err.Error(), "flag provided but not defined: -")
	if name != err.Error() && c.Command != nil && slices.ContainsFunc(c.App.Flags, func(f cli.Flag) bool { return slices.Contains(f.Names(), name) }) {
		return failure.PermanentError(nil, "usage: --%s goes before the command: %s --%s VALUE %s", name, c.App.Name, name, c.Command.FullName())
	}
	return failure.PermanentError(nil, "usage: %s: see %s --help", failure.OneLine(err.Error()), commandLine(c))
}

// unknownCommand is the action of the executor and of commands that group others: without an
// argument it prints the help, with one it refuses it in one line.
func unknownCommand(c *cli.Context) error {
	if !c.Args().Present() {
		if isRoot(c) {
			return cli.ShowAppHelp(c)
		}
		return cli.ShowSubcommandHelp(c)
	}
	return failure.PermanentError(nil, "usage: unknown command %q: see %s --help", c.Args().First(), commandLine(c))
}

// commandLine names the command c runs, as the user would type it: "sandbox-executor tls init".
func commandLine(c *cli.Context) string {
	var names []string
	for _, ctx := range c.Lineage() {
		if !isRoot(ctx) {
			names = append(names, ctx.Command.Name)
		}
	}
	slices.Reverse(names)
	return strings.Join(append([]string{c.App.Name}, names...), " ")
}

// isRoot tells whether c is the executor's own, before any command.
func isRoot(c *cli.Context) bool { return c.Command == nil || c.Command.Name == c.App.Name }
