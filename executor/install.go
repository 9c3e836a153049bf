package executor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"

	"github.com/sandbox-executor/sandbox-executor/executor/agent"
)

// installScript reads a line (the network path's token, or nothing) and then the agent from
// stdin into the pod's private directory, checks that all of it arrived, and runs its init:
// start the job's stage daemon, then report on the pod. POSIX sh and coreutils only; the shell's
// read takes the line byte by byte, leaving the binary on stdin, and the token never appears in
// an argument list.
const installScript = `umask 077 && IFS= read -r t && mkdir -p "$1/stages" && cat > "$1/agent.new" && n=$(wc -c < "$1/agent.new") && [ $n -eq "$2" ] && chmod 700 "$1/agent.new" && mv "$1/agent.new" "$1/agent" && d=$1 && shift 2 && printf %s "$t" | "$d/agent" init "$@"`

// InstallAgent copies the stage agent into the pod over exec stdin, in the one exec that prepare
// pays anyway, and returns what the agent found (shell, kernel). With a token, the agent's daemon
// also serves the network path (AgentNetwork), authenticated by it.
func InstallAgent(ctx context.Context, ex RemoteExecutor, sbx *Sandbox, binary []byte, token string) (*agent.Probe, error) {
	var stdout, stderr bytes.Buffer
	command := []string{"/bin/sh", "-c", installScript, "sh", agent.BaseDir, strconv.Itoa(len(binary))}
	if token != "" {
		command = append(command, "--listen", ":"+strconv.Itoa(agent.NetworkPort))
	}
	err := ex.Exec(ctx, ExecRequest{
		Namespace: sbx.Namespace, Pod: sbx.Pod, Container: sbx.Container,
		Command: command,
		Stdin:   io.MultiReader(strings.NewReader(token+"\n"), bytes.NewReader(binary)),
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
