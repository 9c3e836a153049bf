package executor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// CheckFence asks the pod's agent, over ex (the job's transport), for a fresh check of the pod's
// egress fence. An agent older than the check (it does not know the command) reports a fence that
// is not configured: whether that may pass is prepare's decision (require_fence).
func CheckFence(ctx context.Context, ex kube.RemoteExecutor, sbx *kube.Sandbox) (*wire.FenceReport, error) {
	var stdout, stderr bytes.Buffer
	err := ex.Exec(ctx, kube.ExecRequest{Namespace: sbx.Namespace, Pod: sbx.Pod, Container: sbx.Container, Command: wire.FenceArgs(), Stdout: &stdout, Stderr: &stderr})
	var exit *kube.ExitError
	var refused *RefusedError
	switch {
	case errors.As(err, &exit) && exit.Code == wire.ExitAgentFailure && strings.Contains(stderr.String(), "unknown command"),
		errors.As(err, &refused) && strings.Contains(refused.Reason, "bad arguments"):
		return &wire.FenceReport{}, nil
	case err != nil:
		return nil, failure.SystemError(nil, "checking the egress fence of pod %s/%s: %s", sbx.Namespace, sbx.Pod, failure.OneLine(strings.TrimSpace(stderr.String()+" "+err.Error())))
	}
	var report wire.FenceReport
	if err := json.Unmarshal(stdout.Bytes(), &report); err != nil {
		return nil, failure.SystemError(nil, "the stage agent in pod %s answered its fence check with %q", sbx.Pod, failure.OneLine(stdout.String()))
	}
	return &report, nil
}
