// Package stagehost is the executor's side of the stage server (`sandbox-executor serve`, and
// start-runner's --stage-server): it listens on the socket (package stageserver) and runs the
// stages it is handed with one connection per cluster, kept warm between jobs, and with the
// network transport the identity lines of the namespace's pods, read ahead (kube.AgentLines).
// Package stageserver knows nothing of Kubernetes, so that the stage launcher links no client-go;
// what needs the cluster is here.
package stagehost

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/sandbox-executor/sandbox-executor/buildinfo"
	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/stageserver"
)

// Connect connects to the cluster a config names.
type Connect func(*config.Config) (*kube.Clients, error)

// RunStage runs a stage the server was handed, connecting through clients, and returns its exit
// code.
type RunStage func(ctx context.Context, req stageserver.Request, clients Connect, stdout, stderr io.Writer) int

// Host is a stage server's configuration.
type Host struct {
	// Socket is the Unix socket to listen on.
	Socket string
	// Drain bounds the stages still running when the server stops.
	Drain time.Duration
	// Connect makes a cluster connection; the host shares each one between stages.
	Connect Connect
	// Run runs a stage.
	Run RunStage
	// Log receives the server's own lines.
	Log io.Writer
	// Warm, if set, is connected to at the start, so that the first job finds its identity lines
	// read too.
	Warm *config.Config
}

// Listen listens on the socket and returns the loop that serves stages there until its context
// ends.
func (h Host) Listen() (serve func(context.Context) error, err error) {
	ln, err := stageserver.Listen(h.Socket)
	if err != nil {
		return nil, failure.PermanentError(nil, "%s", err)
	}
	fmt.Fprintf(h.Log, "stage server: listening on %s\n", h.Socket)
	return func(ctx context.Context) error {
		clients := &sharedClients{connect: h.Connect, background: ctx}
		defer clients.wait()
		if h.Warm != nil {
			if _, err := clients.get(h.Warm); err != nil {
				fmt.Fprintf(h.Log, "stage server: connecting to the cluster ahead of the first stage: %s\n", failure.OneLine(err.Error()))
			}
		}
		server := &stageserver.Server{
			Drain:   h.Drain,
			Log:     h.Log,
			Version: buildinfo.Version,
			Handler: func(ctx context.Context, req stageserver.Request, stdout, stderr io.Writer) int {
				return h.Run(ctx, req, clients.get, stdout, stderr)
			},
		}
		return server.Serve(ctx, ln)
	}, nil
}
