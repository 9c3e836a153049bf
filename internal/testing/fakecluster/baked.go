package fakecluster

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/agentca"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// BakedAgent is the agent's "serve" (the baked-in agent's command) running on the host, as a
// job container would, and the cluster around it: its log and an exec into its "pod" (Local).
// Packages that use it call Main from TestMain: "serve" is this test binary.
type BakedAgent struct {
	Port   int
	Stages string
	Local  *Local
	first  chan string
}

// Exec is the exec into the agent's "pod".
func (b *BakedAgent) Exec() kube.RemoteExecutor { return b.Local }

// FirstLogLine is the first line of the agent's stdout, as the kubelet keeps it for the pod's
// log.
func (b *BakedAgent) FirstLogLine(ctx context.Context, _ *kube.Sandbox, within time.Duration) (string, error) {
	select {
	case line := <-b.first:
		b.first <- line // for the next reader
		return line, nil
	case <-time.After(within):
		return "", kube.ErrNoLogLine
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// Identity is the identity the agent logged.
func (b *BakedAgent) Identity(t testing.TB) string {
	t.Helper()
	line, err := b.FirstLogLine(context.Background(), nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	identity, _, ok := wire.ParseFirstLogLine(line)
	if !ok || identity == "" {
		t.Fatalf("first log line %q: no identity", line)
	}
	return identity
}

// StartBakedAgent starts "serve" with ca's certificate in its environment (none: nil), its
// network path on a free loopback port, until the test ends.
func StartBakedAgent(t testing.TB, ca *agentca.CA) *BakedAgent {
	t.Helper()
	stages := filepath.Join(t.TempDir(), "stages")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	serve := exec.Command(os.Args[0], "serve", "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--stages", stages)
	serve.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	serve.Env = os.Environ()
	if ca != nil {
		serve.Env = append(serve.Env, wire.ClientCAEnv+"="+string(ca.CertificatePEM()))
	}
	stdout, err := serve.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	b := &BakedAgent{Port: port, Stages: stages, first: make(chan string, 1), Local: NewLocal(t)}
	go func() {
		r := bufio.NewReader(stdout)
		line, _ := r.ReadString('\n')
		b.first <- line
		_, _ = io.Copy(io.Discard, r)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-serve.Process.Pid, syscall.SIGKILL) // serve and its daemon
		_ = serve.Wait()
	})
	return b
}
