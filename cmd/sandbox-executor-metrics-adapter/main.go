// sandbox-executor-metrics-adapter serves the warm pools' gauges through the External metrics
// API (external.metrics.k8s.io/v1beta1) for the HorizontalPodAutoscaler that sizes a pool
// (docs/metrics.md, "Autoscaling a pool"). It runs behind the aggregation layer, as the chart's
// APIService installs it; its flags are sigs.k8s.io/custom-metrics-apiserver's (serving,
// delegated authentication and authorization, --lister-kubeconfig) and --namespace.
//
// Its flags are parsed with pflag, not urfave/cli like the other binaries: the API server
// library defines them on a pflag.FlagSet, and Kubernetes components' flag conventions are what
// an operator of an aggregated API server expects.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/component-base/logs"
	"k8s.io/utils/clock"

	"github.com/sandbox-executor/sandbox-executor/metricsadapter"
)

// Exit codes: 2 for a command line that cannot run, 1 for a failure while running.
const (
	exitFailure = 1
	exitUsage   = 2
)

func main() {
	flags := pflag.NewFlagSet(metricsadapter.Name, pflag.ContinueOnError)
	adapter := metricsadapter.New(flags, clock.RealClock{})
	logs.AddFlags(flags)
	if err := flags.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			os.Exit(0)
		}
		fail(exitUsage, err)
	}
	if flags.NArg() > 0 {
		fail(exitUsage, fmt.Errorf("unexpected arguments %q: everything is a flag (--help)", flags.Args()))
	}
	if adapter.Namespace == "" {
		fail(exitUsage, metricsadapter.ErrNoNamespace)
	}
	logs.InitLogs()
	defer logs.FlushLogs()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := adapter.Run(ctx, os.Stdout); err != nil {
		fail(exitFailure, err)
	}
}

func fail(code int, err error) {
	fmt.Fprintf(os.Stderr, "%s: %v\n", metricsadapter.Name, err)
	os.Exit(code)
}
