package executor_test

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/executor"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/fakecluster"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// The job owns its pod, so whatever answers for the agent may be the job's: these tests answer
// a stage with a gigabyte, streamed, and check that the runner's side stays small and fails the
// stage as a system failure.
const (
	floodBytes = 1 << 30
	heapLimit  = 64 << 20
)

// hostileAgent serves the network path with a key of its own, pinned by the returned transport,
// and answers every request with answer.
func hostileAgent(t *testing.T, answer func(w io.Writer)) *executor.AgentNetwork {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "agent"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		ClientAuth:   tls.RequireAnyClientCert,
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			if line, err := bufio.NewReader(conn).ReadString('\n'); err == nil && strings.HasPrefix(line, "SBX2 ") {
				answer(conn)
			}
			conn.Close()
		}
	}()
	config, err := fakecluster.AgentCA(t).ClientConfig(testJob, wire.IdentityOf(cert.RawSubjectPublicKeyInfo))
	if err != nil {
		t.Fatal(err)
	}
	return executor.NewAgentNetwork("127.0.0.1", ln.Addr().(*net.TCPAddr).Port, config, nil)
}

// writeFlood sends the flood as stderr frames of the largest size, then exit code.
func writeFlood(w io.Writer, flood io.Reader, code int) {
	buf := make([]byte, wire.MaxFrame)
	for {
		n, err := io.ReadFull(flood, buf)
		if n > 0 && wire.WriteFrame(w, wire.FrameStderr, buf[:n]) != nil {
			return
		}
		if err != nil {
			break
		}
	}
	_ = wire.WriteFrame(w, wire.FrameExit, []byte(strconv.Itoa(code)))
}

func checkBounded(t *testing.T, heap *testutil.PeakHeap, err error) {
	t.Helper()
	if peak := heap.Stop(); peak > heapLimit {
		t.Errorf("the heap peaked at %d MiB answering a %d MiB flood; want under %d MiB", peak>>20, floodBytes>>20, heapLimit>>20)
	}
	if err == nil || failure.KindOf(err) != failure.KindSystem {
		t.Fatalf("Run = %.200v; want a system failure", err)
	}
	if msg := err.Error(); len(msg) > 600 || strings.Contains(msg, "\n") || !strings.Contains(msg, `"xxxx`) || !strings.Contains(msg, " bytes)") {
		t.Errorf("the error line carries %d bytes of the agent's answer, want one short line quoting its head and saying its size: %.700s", len(msg), msg)
	}
}

// A refusal's reason is the head of stderr: a gigabyte of it is not kept.
func TestAGigabyteRefusalStaysBounded(t *testing.T) {
	heap := testutil.WatchHeap(t, heapLimit)
	a := hostileAgent(t, func(w io.Writer) {
		writeFlood(w, &testutil.Flood{N: floodBytes, Fill: 'x', Stop: heap.Over}, wire.ExitRefused)
	})
	var log testutil.LockedBuffer
	_, err := newStageRunner(a, &log, "").Run(context.Background(), "build_script", []byte("true\n"), io.Discard, io.Discard)
	checkBounded(t, heap, err)
	if !strings.Contains(err.Error(), "refused this job's stage") {
		t.Errorf("Run = %.200v; want the refusal", err)
	}
}

// killFlood answers the stage with nothing until it is cancelled, and the kill with a gigabyte
// of stderr and a failure.
type killFlood struct{ stop func() bool }

func (k killFlood) Exec(ctx context.Context, req kube.ExecRequest) error {
	if req.Command[1] != "kill" {
		<-ctx.Done()
		return ctx.Err()
	}
	_, _ = io.Copy(req.Stderr, &testutil.Flood{N: floodBytes, Fill: 'x', Stop: k.stop})
	return &kube.ExitError{Code: 1}
}

// A cancelled stage's kill output becomes one error line: a gigabyte of it is not buffered.
func TestAGigabyteKillAnswerStaysBounded(t *testing.T) {
	heap := testutil.WatchHeap(t, heapLimit)
	var log testutil.LockedBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := newStageRunner(killFlood{stop: heap.Over}, &log, "").Run(ctx, "build_script", []byte("true\n"), io.Discard, io.Discard)
	checkBounded(t, heap, err)
	if !strings.Contains(err.Error(), "stopping its processes") {
		t.Errorf("Run = %.200v; want the failed kill", err)
	}
}
