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

// receiveFile defines receive FILE SIZE for the install scripts: it reads stdin to its end into
// FILE.new, checks that all SIZE bytes arrived (a dropped stream must not leave a truncated
// binary behind), makes it executable and renames it into place. POSIX sh and coreutils only.
const receiveFile = `receive() { cat > "$1.new" && n=$(wc -c < "$1.new") && if [ "$n" -ne "$2" ]; then echo "received $n of $2 bytes" >&2; return 1; fi && chmod 700 "$1.new" && mv -f "$1.new" "$1"; } && `

// installScript reads a line (the network path's token, or nothing) and then the agent from
// stdin into the pod's private directory, and runs its init: start the job's stage daemon, then
// report on the pod. The shell's read takes the line byte by byte, leaving the binary on stdin,
// and the token never appears in an argument list.
const installScript = receiveFile + `umask 077 && IFS= read -r t && mkdir -p "$1/stages" && receive "$1/agent" "$2" && d=$1 && shift 2 && printf %s "$t" | "$d/agent" init "$@"`

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
	if err := installError(err, &stderr, sbx, "the stage agent"); err != nil {
		return nil, err
	}
	var probe agent.Probe
	if err := json.Unmarshal(stdout.Bytes(), &probe); err != nil {
		return nil, SystemError(nil, "the stage agent in pod %s answered its probe with %q", sbx.Pod, oneLine(stdout.String()))
	}
	return &probe, nil
}

// installError turns a failed install exec into the error prepare reports: a missing shell is
// the image's fault (permanent), anything else the infrastructure's.
func installError(err error, stderr *bytes.Buffer, sbx *Sandbox, what string) error {
	if err == nil {
		return nil
	}
	reason := strings.TrimSpace(stderr.String())
	if reason == "" {
		reason = err.Error()
	}
	var exit *ExitError
	switch {
	case errors.As(err, &exit):
		return SystemError(nil, "installing %s in pod %s failed (exit %d): %s", what, sbx.Pod, exit.Code, oneLine(reason))
	case strings.Contains(reason, "executable file not found") || strings.Contains(reason, "no such file"):
		return PermanentError(nil, "the job image has no /bin/sh: sandbox-executor needs a POSIX shell in the image")
	default:
		return SystemError(nil, "exec into pod %s/%s failed: %s", sbx.Namespace, sbx.Pod, oneLine(reason))
	}
}
