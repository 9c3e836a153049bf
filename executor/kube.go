package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
	sandboxclient "sigs.k8s.io/agent-sandbox/clients/k8s/clientset/versioned"
	extclient "sigs.k8s.io/agent-sandbox/clients/k8s/extensions/clientset/versioned"

	"github.com/sandbox-executor/sandbox-executor/config"
)

// Clients bundles the typed clientsets and the exec transport. Tests build it from fakes.
type Clients struct {
	Kube       kubernetes.Interface
	Sandboxes  sandboxclient.Interface
	Extensions extclient.Interface
	Exec       RemoteExecutor
	Attach     Attacher
}

// RESTConfig builds the client config: kubeconfig and context from the config file, else the
// in-cluster service account, else the default loading rules ($KUBECONFIG, ~/.kube/config).
func RESTConfig(cfg *config.Config) (*rest.Config, error) {
	var rc *rest.Config
	var err error
	if cfg.Kubeconfig == "" && cfg.Context == "" {
		rc, err = rest.InClusterConfig()
		if errors.Is(err, rest.ErrNotInCluster) {
			rc, err = loadKubeconfig("", "")
		}
	} else {
		rc, err = loadKubeconfig(cfg.Kubeconfig, cfg.Context)
	}
	if err != nil {
		return nil, PermanentError(nil, "kubernetes client config (kubeconfig %q, context %q): %v", cfg.Kubeconfig, cfg.Context, err)
	}
	// One job makes a handful of calls, but many runners share an API server: keep client-side
	// throttling out of the way and let API priority and fairness do its job.
	rc.QPS, rc.Burst = 50, 100
	rc.UserAgent = "sandbox-executor"
	return rc, nil
}

func loadKubeconfig(path, context string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	}
	overrides := &clientcmd.ConfigOverrides{CurrentContext: context}
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
}

// NewClients connects to the cluster named by the config.
func NewClients(cfg *config.Config) (*Clients, error) {
	rc, err := RESTConfig(cfg)
	if err != nil {
		return nil, err
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, PermanentError(err, "kubernetes client")
	}
	sbx, err := sandboxclient.NewForConfig(rc)
	if err != nil {
		return nil, PermanentError(err, "agent-sandbox client")
	}
	ext, err := extclient.NewForConfig(rc)
	if err != nil {
		return nil, PermanentError(err, "agent-sandbox extensions client")
	}
	pe := &podExec{config: rc, kube: kube}
	return &Clients{Kube: kube, Sandboxes: sbx, Extensions: ext, Exec: pe, Attach: pe}, nil
}

// ExecRequest is one command run in a container of a pod.
type ExecRequest struct {
	Namespace, Pod, Container string
	Command                   []string
	Stdin                     io.Reader
	Stdout, Stderr            io.Writer
}

// Attacher writes to the stdin of a container's main process (pods/attach).
type Attacher interface {
	Attach(ctx context.Context, req ExecRequest) error
}

// RemoteExecutor runs a command in a pod. Exec returns nil when the command exits 0, an
// *ExitError when it exits non-zero, and any other error when the stream itself failed.
type RemoteExecutor interface {
	Exec(ctx context.Context, req ExecRequest) error
}

// ExitError is a remote command's non-zero exit.
type ExitError struct{ Code int }

func (e *ExitError) Error() string { return fmt.Sprintf("command exited with code %d", e.Code) }

// podExec is the client-go pods/exec transport: WebSocket (v5 protocol) with SPDY fallback for
// API servers or proxies that cannot upgrade to WebSocket.
type podExec struct {
	config *rest.Config
	kube   kubernetes.Interface
}

func (p *podExec) Exec(ctx context.Context, req ExecRequest) error {
	return p.stream(ctx, "exec", &corev1.PodExecOptions{
		Container: req.Container,
		Command:   req.Command,
		Stdin:     req.Stdin != nil,
		Stdout:    req.Stdout != nil,
		Stderr:    req.Stderr != nil,
	}, req)
}

// Attach writes req.Stdin to the stdin of the container's main process (pods/attach). Unlike
// an exec, it starts no process in the pod: under gVisor, about a third of the time.
func (p *podExec) Attach(ctx context.Context, req ExecRequest) error {
	req.Stdout, req.Stderr = nil, nil
	return p.stream(ctx, "attach", &corev1.PodAttachOptions{Container: req.Container, Stdin: true}, req)
}

func (p *podExec) stream(ctx context.Context, subresource string, options runtime.Object, req ExecRequest) error {
	execURL := p.kube.CoreV1().RESTClient().Post().
		Resource("pods").Namespace(req.Namespace).Name(req.Pod).SubResource(subresource).
		VersionedParams(options, scheme.ParameterCodec).URL()
	websocket, err := remotecommand.NewWebSocketExecutor(p.config, http.MethodGet, execURL.String())
	if err != nil {
		return err
	}
	spdy, err := remotecommand.NewSPDYExecutor(p.config, http.MethodPost, execURL)
	if err != nil {
		return err
	}
	executor, err := remotecommand.NewFallbackExecutor(websocket, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return err
	}
	err = executor.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: req.Stdin, Stdout: req.Stdout, Stderr: req.Stderr})
	var exitErr utilexec.ExitError
	if errors.As(err, &exitErr) && exitErr.Exited() {
		return &ExitError{Code: exitErr.ExitStatus()}
	}
	return err
}
