package metricsadapter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"

	"github.com/spf13/pflag"
	"k8s.io/utils/clock"
	basecmd "sigs.k8s.io/custom-metrics-apiserver/pkg/cmd"

	"github.com/sandbox-executor/sandbox-executor/kube"
)

// Name is the adapter's name as an API server (its logs, its OpenAPI title).
const Name = "sandbox-executor-metrics-adapter"

// DefaultPort is the HTTPS port it serves on unless --secure-port says otherwise: not 443, so
// that it needs no privilege.
const DefaultPort = 6443

// ErrNoNamespace is the refusal of a command line without --namespace.
var ErrNoNamespace = errors.New("--namespace is required: the namespace whose warm pools to serve")

// Adapter is the adapter's command line and server: the library's flags (serving, delegated
// authentication and authorization, --lister-kubeconfig for its own reads) and --namespace.
type Adapter struct {
	basecmd.AdapterBase
	// Namespace is the namespace whose pools it serves.
	Namespace string
	clock     clock.PassiveClock
}

// New makes an adapter whose flags are on flags.
func New(flags *pflag.FlagSet, clk clock.PassiveClock) *Adapter {
	a := &Adapter{clock: clk}
	a.Name = Name
	a.FlagSet = flags
	a.InstallFlags()
	a.SecureServing.BindPort = DefaultPort
	// Without --tls-cert-file the library makes a self-signed certificate: keep it in memory
	// rather than in a directory beside the working directory (the image's root is read-only).
	a.SecureServing.ServerCert.CertDirectory = ""
	flags.StringVar(&a.Namespace, "namespace", "", "the namespace whose warm pools to serve (required)")
	return a
}

// Run follows the namespace's pools through watches and serves their gauges until ctx ends.
// Once its caches are filled and it listens, it prints one line with its address.
func (a *Adapter) Run(ctx context.Context, stdout io.Writer) error {
	if a.Namespace == "" {
		return ErrNoNamespace
	}
	if err := a.listenOnFreePort(); err != nil {
		return err
	}
	rc, err := a.ClientConfig()
	if err != nil {
		return err
	}
	clients, err := kube.ClientsFor(rc)
	if err != nil {
		return err
	}
	// The exporter's Observer, without its job counters: the same pools, read the same way.
	observer := clients.Observe(a.Namespace, nil, nil)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer observer.Shutdown() // after cancel: the informers stop with ctx
	if err := observer.Run(ctx); err != nil {
		return err
	}
	a.WithExternalMetrics(NewProvider(a.Namespace, func() ([]kube.PoolState, error) { return observer.Pools(a.clock.Now()) }, a.clock))
	server, err := a.Server()
	if err != nil {
		return err
	}
	addr := net.JoinHostPort(a.SecureServing.BindAddress.String(), strconv.Itoa(a.SecureServing.BindPort))
	fmt.Fprintf(stdout, "metrics adapter: serving external.metrics.k8s.io/v1beta1 for the pools of namespace %s on https://%s\n", a.Namespace, addr)
	return server.GenericAPIServer.PrepareRun().RunWithContext(ctx)
}

// listenOnFreePort makes --secure-port 0 mean any free port, as the exporter's --listen does
// (the library refuses 0): the listener is made here and the port it got is the one served.
func (a *Adapter) listenOnFreePort() error {
	s := a.SecureServing
	if s.BindPort != 0 || s.Listener != nil {
		return nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(s.BindAddress.String(), "0"))
	if err != nil {
		return fmt.Errorf("--bind-address %s: %w", s.BindAddress, err)
	}
	s.Listener = ln
	s.BindPort = ln.Addr().(*net.TCPAddr).Port
	return nil
}
