package executor

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/agentca"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// receiveFile defines receive FILE SIZE for the install scripts: it reads stdin to its end into
// FILE.new, checks that all SIZE bytes arrived (a dropped stream must not leave a truncated
// binary behind), makes it executable and renames it into place. POSIX sh and coreutils only.
const receiveFile = `receive() { cat > "$1.new" && n=$(wc -c < "$1.new") && if [ "$n" -ne "$2" ]; then echo "received $n of $2 bytes" >&2; return 1; fi && chmod 700 "$1.new" && mv -f "$1.new" "$1"; } && `

// installScript reads a line (the agent CA for the network path, base64, or nothing) and then
// the agent from stdin into the pod's private directory, and runs its init: start the job's
// stage daemon, then report on the pod (with the daemon's network identity, which comes back
// over this exec, through the API server). The shell's read takes the line byte by byte, leaving
// the binary on stdin.
const installScript = receiveFile + `umask 077 && IFS= read -r t && mkdir -p "$1/stages" && receive "$1/agent" "$2" && d=$1 && shift 2 && printf %s "$t" | "$d/agent" init "$@"`

// InstallAgent copies the stage agent into the pod over exec stdin, in the one exec that prepare
// pays anyway, and returns what the agent found (shell, kernel). With ca, the agent's daemon also
// serves the network path (AgentNetwork) to this CA's client certificates, and the probe names
// its identity.
func InstallAgent(ctx context.Context, ex kube.RemoteExecutor, sbx *kube.Sandbox, binary []byte, ca *agentca.CA) (*wire.Probe, error) {
	var stdout, stderr bytes.Buffer
	command := []string{"/bin/sh", "-c", installScript, "sh", wire.BaseDir, strconv.Itoa(len(binary))}
	var caLine string
	if ca != nil {
		command = append(command, "--listen", ":"+strconv.Itoa(wire.NetworkPort))
		caLine = base64.StdEncoding.EncodeToString(ca.CertificatePEM())
	}
	err := ex.Exec(ctx, kube.ExecRequest{
		Namespace: sbx.Namespace, Pod: sbx.Pod, Container: sbx.Container,
		Command: command,
		Stdin:   io.MultiReader(strings.NewReader(caLine+"\n"), bytes.NewReader(binary)),
		Stdout:  &stdout,
		Stderr:  &stderr,
	})
	if err := installError(err, &stderr, sbx, "the stage agent"); err != nil {
		return nil, err
	}
	return parseProbe(sbx, stdout.Bytes())
}

func parseProbe(sbx *kube.Sandbox, out []byte) (*wire.Probe, error) {
	var probe wire.Probe
	if err := json.Unmarshal(out, &probe); err != nil {
		return nil, failure.SystemError(nil, "the stage agent in pod %s answered its probe with %q", sbx.Pod, failure.OneLine(string(out)))
	}
	return &probe, nil
}

// installError turns a failed install exec into the error prepare reports: a missing shell is
// the image's fault (permanent), anything else the infrastructure's.
func installError(err error, stderr *bytes.Buffer, sbx *kube.Sandbox, what string) error {
	if err == nil {
		return nil
	}
	reason := strings.TrimSpace(stderr.String())
	if reason == "" {
		reason = err.Error()
	}
	var exit *kube.ExitError
	switch {
	case errors.As(err, &exit):
		return failure.SystemError(nil, "installing %s in pod %s failed (exit %d): %s", what, sbx.Pod, exit.Code, failure.OneLine(reason))
	case strings.Contains(reason, "executable file not found") || strings.Contains(reason, "no such file"):
		return failure.PermanentError(nil, "the job image has no /bin/sh: sandbox-executor needs a POSIX shell in the image")
	default:
		return failure.SystemError(nil, "exec into pod %s/%s failed: %s", sbx.Namespace, sbx.Pod, failure.OneLine(reason))
	}
}
