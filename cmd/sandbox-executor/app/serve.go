package app

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/sandbox-executor/sandbox-executor/buildinfo"
	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/stages"
	"github.com/sandbox-executor/sandbox-executor/stageserver"
)

// exitStatus is a stage's exit code as the stage server reported it: the code is the runner's
// answer already, not an error to classify again.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("the stage exited %d", int(e)) }

// forwardStage hands the stage to the stage server when the config names one; handled is false
// when the stage must run here (no server configured, or none took it).
func forwardStage(c *cli.Context, env *stages.Env, deps Deps) (handled bool, err error) {
	socket := env.Config.StageServer
	if socket == "" || deps.Served || !stageserver.Serves(c.Command.Name) {
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
	stage := stageserver.Stage{Config: configPath, Name: c.Command.Name, Args: c.Args().Slice(), Environ: environ(), Started: env.Started}
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
			serve, err := StageServer(socket, c.Duration("drain"), deps, stderr, env.Config)
			if err != nil {
				return err
			}
			return serve(c.Context)
		}),
	}
}

// StageServer listens on socket and returns the loop that serves stages there until its context
// ends; the stages share one connection to each cluster they name, and the identity lines of
// the pods they may be handed, read ahead (kube.AgentLines). With warm, the cluster of that
// config is connected to at the start, so that the first job finds its lines read too.
func StageServer(socket string, drain time.Duration, deps Deps, log io.Writer, warm *config.Config) (func(context.Context) error, error) {
	ln, err := stageserver.Listen(socket)
	if err != nil {
		return nil, failure.PermanentError(nil, "%s", err)
	}
	fmt.Fprintf(log, "stage server: listening on %s\n", socket)
	return func(ctx context.Context) error {
		clients := &sharedClients{connect: deps.Clients, background: ctx}
		defer clients.wait()
		if warm != nil {
			if _, err := clients.get(warm); err != nil {
				fmt.Fprintf(log, "stage server: connecting to the cluster ahead of the first stage: %s\n", failure.OneLine(err.Error()))
			}
		}
		server := &stageserver.Server{
			Drain:   drain,
			Log:     log,
			Version: buildinfo.Version,
			Handler: func(ctx context.Context, req stageserver.Request, stdout, stderr io.Writer) int {
				return RunWith(ctx, req.Args, stdout, stderr, req.Getenv, Deps{Clients: clients.get, Started: req.Started, Served: true})
			},
		}
		return server.Serve(ctx, ln)
	}, nil
}

// sharedClients connects once per cluster and namespace (kubeconfig, context, namespace) and
// hands every stage the same clients: one HTTP/2 connection to the API server, kept warm between
// jobs, and with the network transport the identity lines of the namespace's pods, read ahead. A
// kubeconfig that changes (new credentials, another server) is a new cluster.
type sharedClients struct {
	connect func(*config.Config) (*kube.Clients, error)
	// background is the server's life: the identity lines are followed until it ends.
	background context.Context
	running    sync.WaitGroup
	mu         sync.Mutex
	byKey      map[clientsKey]*sharedCluster
}

type clientsKey struct {
	kubeconfig, context, namespace string
	modified                       time.Time
	size                           int64
}

type sharedCluster struct {
	clients *kube.Clients
	stop    context.CancelFunc
}

func (s *sharedClients) get(cfg *config.Config) (*kube.Clients, error) {
	key := clientsKey{kubeconfig: cfg.Kubeconfig, context: cfg.Context, namespace: cfg.Namespace}
	if info, err := os.Stat(cfg.Kubeconfig); cfg.Kubeconfig != "" && err == nil {
		key.modified, key.size = info.ModTime(), info.Size()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.byKey[key]; ok {
		return c.clients, nil
	}
	connected, err := s.connect(cfg)
	if err != nil {
		return nil, err
	}
	if s.byKey == nil {
		s.byKey = map[clientsKey]*sharedCluster{}
	}
	for old, c := range s.byKey {
		if old.kubeconfig == key.kubeconfig && old.context == key.context && old.namespace == key.namespace {
			c.stop() // the kubeconfig changed since
			delete(s.byKey, old)
		}
	}
	clients := *connected
	ctx, stop := context.WithCancel(s.background)
	if cfg.StageTransport == config.TransportNetwork {
		clients.AgentLines = kube.NewAgentLines(&clients, cfg.Namespace)
		s.running.Add(1)
		go func() {
			defer s.running.Done()
			clients.AgentLines.Run(ctx)
		}()
	}
	s.byKey[key] = &sharedCluster{clients: &clients, stop: stop}
	return &clients, nil
}

// wait stops what the shared clients follow and waits for it, once the server has stopped.
func (s *sharedClients) wait() {
	s.mu.Lock()
	for _, c := range s.byKey {
		c.stop()
	}
	s.mu.Unlock()
	s.running.Wait()
}
