package executor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"

	"github.com/sandbox-executor/sandbox-executor/executor/agent"
)

// installScript writes the agent into the pod's private directory from stdin, checks that all of
// it arrived, and runs its init: start the job's stage daemon, then report on the pod. It is POSIX sh with coreutils, the least any CI image has.
const installScript = `umask 077 && mkdir -p "$1/stages" && cat > "$1/agent.new" && n=$(wc -c < "$1/agent.new") && [ $n -eq "$2" ] && chmod 700 "$1/agent.new" && mv "$1/agent.new" "$1/agent" && exec "$1/agent" init`

// InstallAgent copies the stage agent into the pod over exec stdin, in the one exec that prepare
// pays anyway, and returns what the agent found (shell, kernel).
func InstallAgent(ctx context.Context, ex RemoteExecutor, sbx *Sandbox, binary []byte) (*agent.Probe, error) {
	var stdout, stderr bytes.Buffer
	err := ex.Exec(ctx, ExecRequest{
		Namespace: sbx.Namespace, Pod: sbx.Pod, Container: sbx.Container,
		Command: []string{"/bin/sh", "-c", installScript, "sh", agent.BaseDir, strconv.Itoa(len(binary))},
		Stdin:   bytes.NewReader(binary),
		Stdout:  &stdout,
		Stderr:  &stderr,
	})
	reason := strings.TrimSpace(stderr.String())
	if reason == "" && err != nil {
		reason = err.Error()
	}
	var exit *ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit) && strings.Contains(reason, "agent"):
		return nil, SystemError(nil, "installing the stage agent in pod %s failed: %s", sbx.Pod, oneLine(reason))
	case errors.As(err, &exit):
		return nil, SystemError(nil, "installing the stage agent in pod %s failed (exit %d): %s", sbx.Pod, exit.Code, oneLine(reason))
	case strings.Contains(reason, "executable file not found") || strings.Contains(reason, "no such file"):
		return nil, PermanentError(nil, "the job image has no /bin/sh: sandbox-executor needs a POSIX shell in the image")
	default:
		return nil, SystemError(nil, "exec into pod %s/%s failed: %s", sbx.Namespace, sbx.Pod, oneLine(reason))
	}
	var probe agent.Probe
	if err := json.Unmarshal(stdout.Bytes(), &probe); err != nil {
		return nil, SystemError(nil, "the stage agent in pod %s answered its probe with %q", sbx.Pod, oneLine(stdout.String()))
	}
	return &probe, nil
}
