package app

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/stagehost"
	"github.com/sandbox-executor/sandbox-executor/stages"
	"github.com/sandbox-executor/sandbox-executor/stageserver"
)

// exitStatus is a stage's exit code as the stage server reported it: the code is the runner's
// answer already, not an error to classify again.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("the stage exited %d", int(e)) }

// forwardStage hands prepare and cleanup to the stage server when the config names one; handled
// is false when the stage must run here (no server configured, or none took it). run is handed
// over only by the stage launcher (run_exec naming sandbox-executor-stage): sandbox-executor
// named in run_exec is the direct path, which runs it here, as does the launcher's fallback.
func forwardStage(c *cli.Context, env *stages.Env, deps Deps) (handled bool, err error) {
	socket := env.Config.StageServer
	if socket == "" || deps.Served || !stageserver.Serves(c.Command.Name) || c.Command.Name == "run" {
		return false, nil
	}
	configPath, err := filepath.Abs(env.Config.Path())
	if err != nil {
		return false, failure.PermanentError(err, "config path")
	}
	stage := stageserver.Stage{Config: configPath, Name: c.Command.Name, Args: c.Args().Slice(), Environ: deps.Environ(), Started: env.Started}
	code, err := stageserver.Hand(c.Context, socket, stage, env.Stdout, env.Stderr)
	switch {
	case stageserver.NotServed(err):
		// Nothing ran there: the stage runs here, as without a server.
		env.Log().Warnf("%s: %s runs in its own process (slower); see sandbox-executor doctor", failure.OneLine(err.Error()), c.Command.Name)
		return false, nil
	case err != nil:
		return true, err
	}
	return true, exitStatus(code)
}

// serveCommand is the serve verb: the stage server, until SIGTERM.
func (inv *invocation) serveCommand() *cli.Command {
	return &cli.Command{
		Name:  "serve",
		Usage: "stage server: keep the cluster connection warm for prepare, run and cleanup (stage_server in the config)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "socket", Usage: "the Unix socket (default: stage_server in the config)"},
			&cli.DurationFlag{Name: "drain", Value: 5 * time.Minute, Usage: "on SIGTERM, how long stages still running may take to finish before they are cancelled"},
		},
		Action: inv.setup(func(c *cli.Context, env *stages.Env) error {
			socket := c.String("socket")
			if socket == "" {
				socket = env.Config.StageServer
			}
			if socket == "" {
				return failure.PermanentError(nil, "serve: no socket: set stage_server in %s or pass --socket", env.Config.Path())
			}
			serve, err := inv.stageServer(socket, c.Duration("drain"), env.Config)
			if err != nil {
				return err
			}
			return serve(c.Context)
		}),
	}
}

// stageServer listens on socket and returns the loop that serves stages there, each through
// this command line, until its context ends (package stagehost).
func (inv *invocation) stageServer(socket string, drain time.Duration, warm *config.Config) (func(context.Context) error, error) {
	return StageServer(socket, drain, inv.deps, inv.stderr, warm)
}

// StageServer is the stage server of the executor with deps: tests start one on a fake cluster.
func StageServer(socket string, drain time.Duration, deps Deps, log io.Writer, warm *config.Config) (func(context.Context) error, error) {
	return stagehost.Host{
		Socket:  socket,
		Drain:   drain,
		Connect: deps.Clients,
		Log:     log,
		Warm:    warm,
		Run: func(ctx context.Context, req stageserver.Request, clients stagehost.Connect, stdout, stderr io.Writer) int {
			return RunWith(ctx, req.Args, stdout, stderr, req.Getenv, Deps{Clients: clients, Started: req.Started, Served: true})
		},
	}.Listen()
}
