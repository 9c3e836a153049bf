// Package exporter implements the exporter command: a long-running process that follows the
// namespace's warm pools, claims, sandboxes and pods through informers and serves Prometheus
// metrics about them (metrics.go; docs/metrics.md). It reads what agent-sandbox and the executor
// record on those objects, never anything secret: no Secrets, no logs, and of the executor's
// annotations only the job's outcome (the job binding is a keyed hash and stays unread).
package exporter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/urfave/cli/v2"

	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/kube"
	"github.com/sandbox-executor/sandbox-executor/stages"
)

// Command is the exporter verb and its flags.
func Command(setup stages.Setup) *cli.Command {
	return &cli.Command{
		Name:  "exporter",
		Usage: "serve Prometheus metrics about the namespace's warm pools and jobs until stopped",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "listen", Value: ":9090", Usage: "address to serve /metrics and /healthz on (port 0: any free port, printed at start)"},
		},
		Action: setup(func(c *cli.Context, env *stages.Env) error {
			return Run(c.Context, env, Options{Listen: c.String("listen")})
		}),
	}
}

// Options configure the exporter.
type Options struct {
	// Listen is the address of the HTTP server.
	Listen string
}

// shutdownGrace is how long a scrape in flight gets when the exporter is stopped.
const shutdownGrace = 5 * time.Second

// Run serves the metrics of env's namespace until ctx ends. It prints one line with the address
// it listens on once its caches are filled, so that whoever started it knows when to scrape.
func Run(ctx context.Context, env *stages.Env, opts Options) error {
	clients, err := env.Clients()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", opts.Listen)
	if err != nil {
		return failure.PermanentError(nil, "exporter: --listen %s: %v", opts.Listen, errors.Unwrap(err))
	}
	defer ln.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var observer *kube.Observer
	m := NewMetrics(reg, func() ([]kube.PoolState, error) { return observer.Pools(env.Clock.Now()) })
	observer = clients.Observe(env.Config.Namespace, m.Started, m.Ended)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer observer.Shutdown() // after cancel: the informers stop with ctx
	if err := observer.Run(ctx); err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(env.Stdout, "exporter: serving metrics of namespace %s on http://%s/metrics\n", env.Config.Namespace, ln.Addr())

	select {
	case err := <-served:
		return failure.SystemError(err, "exporter: serving metrics")
	case <-ctx.Done():
	}
	stopCtx, stop := context.WithTimeout(context.Background(), shutdownGrace)
	defer stop()
	if err := srv.Shutdown(stopCtx); err != nil {
		return failure.SystemError(err, "exporter: stopping")
	}
	return nil
}
