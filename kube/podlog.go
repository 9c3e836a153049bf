package kube

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
)

// firstLogLineLimit bounds what is read of a log for its first line.
const firstLogLineLimit = 4 << 10

// ErrNoLogLine is a container that wrote no complete first line in time.
var ErrNoLogLine = errors.New("no first log line yet")

// headLogLine is the first line of the pod's log if the container has written it already
// (ErrNoLogLine otherwise): one GET, no follow. The pod's only container is meant (a job pod's
// init containers do not count).
func headLogLine(ctx context.Context, kube kubernetes.Interface, namespace, pod string) (string, error) {
	limit := int64(firstLogLineLimit)
	data, err := kube.CoreV1().Pods(namespace).GetLogs(pod, &corev1.PodLogOptions{LimitBytes: &limit}).DoRaw(ctx)
	if err != nil {
		return "", explainAPIError(err, apiCall{Verb: "get", Resource: "pods/log", Namespace: namespace, Name: pod})
	}
	line, _, complete := strings.Cut(string(data), "\n")
	if !complete {
		return "", ErrNoLogLine
	}
	return line + "\n", nil
}

// firstLogLine follows the container's log from its start until its first line is complete, for
// at most within. The log comes from the kubelet through the API server (TLS, authenticated):
// what it says, the container itself wrote before any job ran in it.
func firstLogLine(ctx context.Context, kube kubernetes.Interface, namespace, pod, container string, within time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	limit := int64(firstLogLineLimit)
	stream, err := kube.CoreV1().Pods(namespace).GetLogs(pod, &corev1.PodLogOptions{Container: container, Follow: true, LimitBytes: &limit}).Stream(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("%w after %s", ErrNoLogLine, within)
		}
		return "", explainAPIError(err, apiCall{Verb: "get", Resource: "pods/log", Namespace: namespace, Name: pod})
	}
	defer stream.Close()
	line, err := bufio.NewReaderSize(stream, firstLogLineLimit).ReadString('\n')
	switch {
	case err == nil:
		return line, nil
	case ctx.Err() != nil, errors.Is(err, io.EOF):
		return "", fmt.Errorf("%w after %s", ErrNoLogLine, within)
	default:
		return "", fmt.Errorf("reading the log of pod %s/%s: %w", namespace, pod, err)
	}
}
