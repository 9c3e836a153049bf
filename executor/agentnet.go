package executor

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/sandbox-executor/sandbox-executor/executor/agent"
)

// AgentNetwork runs agent commands over the pod network, straight to the job's stage daemon,
// instead of through the API server and the kubelet. Anything else, and any agent command when
// the pod cannot be reached, goes to Fallback (exec). The stage protocol is the same either way:
// the same arguments, streams and status lines, so resuming and no-false-success hold as well.
type AgentNetwork struct {
	Addr     string
	Token    string
	Fallback RemoteExecutor
	Client   *http.Client
}

// NewAgentNetwork reaches the daemon of the pod at podIP.
func NewAgentNetwork(podIP, token string, fallback RemoteExecutor) *AgentNetwork {
	dialer := &net.Dialer{Timeout: 2 * time.Second, KeepAlive: 15 * time.Second}
	return &AgentNetwork{
		Addr:     net.JoinHostPort(podIP, strconv.Itoa(agent.NetworkPort)),
		Token:    token,
		Fallback: fallback,
		Client:   &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext, DisableCompression: true}},
	}
}

// NewAgentToken makes the per-job secret that authenticates the network path.
func NewAgentToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Exec implements RemoteExecutor.
func (a *AgentNetwork) Exec(ctx context.Context, req ExecRequest) error {
	if len(req.Command) < 2 || req.Command[0] != agent.BinaryPath {
		return a.Fallback.Exec(ctx, req)
	}
	args, _ := json.Marshal(req.Command[1:])
	var body io.Reader = http.NoBody
	if req.Stdin != nil {
		// Buffered, so a fallback to exec can send the same bytes again.
		data, err := io.ReadAll(req.Stdin)
		if err != nil {
			return err
		}
		body = bytes.NewReader(data)
		req.Stdin = bytes.NewReader(data)
	}
	httpReq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+a.Addr+"/v1/exec", body)
	if err != nil {
		return err
	}
	httpReq.Header.Set("Authorization", "Bearer "+a.Token)
	httpReq.Header.Set("Sbx-Args", string(args))
	resp, err := a.Client.Do(httpReq)
	if err != nil {
		var opErr *net.OpError
		if ctx.Err() == nil && asDialError(err, &opErr) {
			return a.Fallback.Exec(ctx, req) // pod network unreachable (policy, CNI): exec works anywhere
		}
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("stage agent at %s answered %s: %s", a.Addr, resp.Status, bytes.TrimSpace(msg))
	}
	stdout, stderr := req.Stdout, req.Stderr
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	code, err := agent.ReadFrames(resp.Body, stdout, stderr)
	if err != nil {
		return err
	}
	if code != 0 {
		return &ExitError{Code: code}
	}
	return nil
}

func asDialError(err error, target **net.OpError) bool {
	for e := err; e != nil; {
		if op, ok := e.(*net.OpError); ok && op.Op == "dial" {
			*target = op
			return true
		}
		u, ok := e.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		e = u.Unwrap()
	}
	return false
}
