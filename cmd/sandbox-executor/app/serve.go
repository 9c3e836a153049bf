package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/stages"
	"github.com/sandbox-executor/sandbox-executor/stageserver"
)

// servedStages are the stages that go through the stage server when one is configured: the
// ones that talk to the API server, where a warm connection saves most. run talks to the pod's
// agent and keeps its own process.
var servedStages = map[string]bool{"prepare": true, "cleanup": true}

// exitStatus is a stage's exit code as the stage server reported it: the code is the runner's
// answer already, not an error to classify again.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("the stage exited %d", int(e)) }

// forwardStage hands the stage to the stage server when the config names one; handled is false
// when the stage must run here (no server configured, or none listening).
func forwardStage(c *cli.Context, env *stages.Env, deps Deps) (handled bool, err error) {
	socket := env.Config.StageServer
	if socket == "" || deps.Served || !servedStages[c.Command.Name] {
		return false, nil
	}
	configPath, err := filepath.Abs(env.Config.Path())
	if err != nil {
		return false, failure.PermanentError(err, "config path")
	}
	environ := deps.Environ
	if environ == nil {
		environ = os.Environ
	}
	args := append([]string{c.App.Name, "--config", configPath, c.Command.Name}, c.Args().Slice()...)
	req := stageserver.Request{Args: args, Environ: environ(), Started: env.Started, Version: env.Version}
	code, err := stageserver.Forward(c.Context, socket, req, env.Stdout, env.Stderr)
	switch {
	case err == nil:
		return true, exitStatus(code)
	case errors.Is(err, context.Canceled) && c.Context.Err() != nil:
		return true, failure.SystemError(err, "%s cancelled before it started", c.Command.Name)
	case stageserver.NotServed(err):
		// Nothing ran there: the stage runs here, as without a server.
		env.Log().Warnf("%s: %s runs in its own process (slower); see sandbox-executor doctor", failure.OneLine(err.Error()), c.Command.Name)
		return false, nil
	default:
		// What the stage did there is unknown: the runner retries, and prepare and cleanup are
		// idempotent.
		return true, failure.SystemError(err, "stage server %s", socket)
	}
}

// serveCommand is the serve verb: the stage server, until SIGTERM.
func serveCommand(stage func(func(*cli.Context, *stages.Env) error) cli.ActionFunc, deps Deps, stderr io.Writer) *cli.Command {
	return &cli.Command{
		Name:  "serve",
		Usage: "stage server: keep the cluster connection warm for prepare and cleanup (stage_server in the config)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "socket", Usage: "the Unix socket (default: stage_server in the config)"},
			&cli.DurationFlag{Name: "drain", Value: 5 * time.Minute, Usage: "on SIGTERM, how long stages still running may take to finish before they are cancelled"},
		},
		Action: stage(func(c *cli.Context, env *stages.Env) error {
			socket := c.String("socket")
			if socket == "" {
				socket = env.Config.StageServer
			}
			if socket == "" {
				return failure.PermanentError(nil, "serve: no socket: set stage_server in %s or pass --socket", env.Config.Path())
			}
			serve, err := StageServer(socket, c.Duration("drain"), deps, stderr)
			if err != nil {
				return err
			}
			fmt.Fprintf(stderr, "stage server: listening on %s\n", socket)
			return serve(c.Context)
		}),
	}
}

// StageServer listens on socket and returns the loop that serves stages there until its context
// ends; the stages share one connection to each cluster they name.
func StageServer(socket string, drain time.Duration, deps Deps, log io.Writer) (func(context.Context) error, error) {
	ln, err := stageserver.Listen(socket)
	if err != nil {
		return nil, failure.PermanentError(nil, "%s", err)
	}
	clients := &sharedClients{connect: deps.Clients}
	server := &stageserver.Server{
		Drain:   drain,
		Log:     log,
		Version: Version,
		Handler: func(ctx context.Context, req stageserver.Request, stdout, stderr io.Writer) int {
			return RunWith(ctx, req.Args, stdout, stderr, req.Getenv, Deps{Clients: clients.get, Started: req.Started, Served: true})
		},
	}
	return func(ctx context.Context) error { return server.Serve(ctx, ln) }, nil
}

// sharedClients connects once per cluster (kubeconfig and context) and hands every stage the
// same clients: one HTTP/2 connection to the API server, kept warm between jobs. A kubeconfig
// that changes (new credentials, another server) is a new cluster.
type sharedClients struct {
	connect func(*config.Config) (*kube.Clients, error)
	mu      sync.Mutex
	byKey   map[clientsKey]*kube.Clients
}

type clientsKey struct {
	kubeconfig, context string
	modified            time.Time
	size                int64
}

func (s *sharedClients) get(cfg *config.Config) (*kube.Clients, error) {
	key := clientsKey{kubeconfig: cfg.Kubeconfig, context: cfg.Context}
	if info, err := os.Stat(cfg.Kubeconfig); cfg.Kubeconfig != "" && err == nil {
		key.modified, key.size = info.ModTime(), info.Size()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.byKey[key]; ok {
		return c, nil
	}
	c, err := s.connect(cfg)
	if err != nil {
		return nil, err
	}
	if s.byKey == nil {
		s.byKey = map[clientsKey]*kube.Clients{}
	}
	for old := range s.byKey {
		if old.kubeconfig == key.kubeconfig && old.context == key.context {
			delete(s.byKey, old) // the kubeconfig changed since
		}
	}
	s.byKey[key] = c
	return c, nil
}
