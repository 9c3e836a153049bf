package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
	"k8s.io/streaming/pkg/httpstream"
)

// ExecRequest is one command run in a container of a pod.
type ExecRequest struct {
	Namespace, Pod, Container string
	Command                   []string
	Stdin                     io.Reader
	Stdout, Stderr            io.Writer
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
