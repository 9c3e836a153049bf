package stageserver

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serving starts a server with handler on a socket in a fresh directory and stops it when the
// test ends; it returns the socket and the server's log.
func serving(t *testing.T, handler Handler) (string, *testutil.LockedBuffer) {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "run", "stages.sock")
	ln, err := Listen(socket)
	if err != nil {
		t.Fatal(err)
	}
	log := &testutil.LockedBuffer{}
	srv := &Server{Handler: handler, Drain: 5 * time.Second, Log: log, Version: "v1.2.3"}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return socket, log
}

func request(args ...string) Request {
	return Request{Args: append([]string{"sandbox-executor", "--config", "/etc/x.toml"}, args...), Environ: []string{"A=1", "SECRET=s3cr3t", "A=2"}, Started: time.Unix(1700000000, 5), Version: "v1.2.3"}
}

func TestForwardRelaysOutputAndExitCode(t *testing.T) {
	big := strings.Repeat("x", 3*maxOutput+17) // split into frames
	var got Request
	socket, log := serving(t, func(ctx context.Context, req Request, stdout, stderr io.Writer) int {
		got = req
		fmt.Fprintln(stdout, "to stdout")
		fmt.Fprintln(stderr, "to stderr")
		io.WriteString(stdout, big)
		return 37
	})
	var stdout, stderr bytes.Buffer
	code, err := forward(context.Background(), socket, request("prepare"), &stdout, &stderr)
	if err != nil || code != 37 {
		t.Fatalf("Forward = %d, %v; want 37, nil", code, err)
	}
	if stdout.String() != "to stdout\n"+big || stderr.String() != "to stderr\n" {
		t.Errorf("stdout %d bytes, stderr %q", stdout.Len(), stderr.String())
	}
	if got.Getenv("A") != "2" || got.Getenv("SECRET") != "s3cr3t" || got.Getenv("MISSING") != "" || !got.Started.Equal(time.Unix(1700000000, 5)) {
		t.Errorf("the server got %+v", got)
	}
	if line := log.String(); !strings.Contains(line, "prepare exited 37 in ") || strings.Contains(line, "s3cr3t") {
		t.Errorf("server log %q: want the stage and its exit, never the environment", line)
	}
}

// A job's environment over the agent protocol's frame limit still travels as the one request
// frame the server reads (the stage server has its own, larger limit).
func TestARequestOverTheAgentsFrameLimitIsServed(t *testing.T) {
	req := request("prepare")
	req.Environ = append(req.Environ, "BIG="+strings.Repeat("v", 2*wire.MaxFrame))
	var got Request
	socket, _ := serving(t, func(ctx context.Context, req Request, stdout, stderr io.Writer) int {
		got = req
		return 0
	})
	if code, err := forward(context.Background(), socket, req, io.Discard, io.Discard); err != nil || code != 0 {
		t.Fatalf("forward = %d, %v; want 0, nil", code, err)
	}
	if len(got.Getenv("BIG")) != 2*wire.MaxFrame {
		t.Errorf("the server got BIG of %d bytes, want %d", len(got.Getenv("BIG")), 2*wire.MaxFrame)
	}
}

func TestForwardWithoutAServer(t *testing.T) {
	dir := t.TempDir()
	if _, err := forward(context.Background(), filepath.Join(dir, "none.sock"), request("prepare"), io.Discard, io.Discard); !errors.Is(err, ErrUnavailable) || !NotServed(err) {
		t.Errorf("no socket: %v, want ErrUnavailable", err)
	}
	// A socket left by a server that died: nobody listens.
	stale := filepath.Join(dir, "run", "stale.sock")
	os.Mkdir(filepath.Dir(stale), 0o700)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	if _, err := forward(context.Background(), stale, request("prepare"), io.Discard, io.Discard); !errors.Is(err, ErrUnavailable) {
		t.Errorf("stale socket: %v, want ErrUnavailable", err)
	}
	// Listen replaces it.
	ln2, err := Listen(stale)
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	ln2.Close()
}

func TestListenRefusesALiveSocketAndOtherFiles(t *testing.T) {
	socket, _ := serving(t, func(context.Context, Request, io.Writer, io.Writer) int { return 0 })
	if _, err := Listen(socket); err == nil || !strings.Contains(err.Error(), "another server is listening") {
		t.Errorf("second Listen: %v", err)
	}
	dir := filepath.Join(t.TempDir(), "run")
	os.Mkdir(dir, 0o700)
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o600)
	if _, err := Listen(file); err == nil || !strings.Contains(err.Error(), "is not a socket") {
		t.Errorf("Listen on a file: %v", err)
	}
	if _, err := Listen("relative.sock"); err == nil {
		t.Error("Listen on a relative path succeeded")
	}
}

// The socket's directory is made private, or must be: one open to others (/tmp, /run) is
// refused and left as it is.
func TestListenKeepsTheSocketPrivate(t *testing.T) {
	open := filepath.Join(t.TempDir(), "open")
	os.Mkdir(open, 0o777)
	os.Chmod(open, 0o777)
	if _, err := Listen(filepath.Join(open, "stages.sock")); err == nil || !strings.Contains(err.Error(), "is open to other users (mode 0777)") {
		t.Errorf("Listen in a directory open to all: %v", err)
	}
	if info, _ := os.Stat(open); info.Mode().Perm() != 0o777 {
		t.Errorf("the open directory was changed to %v", info.Mode())
	}
	dir := filepath.Join(t.TempDir(), "new", "run")
	socket := filepath.Join(dir, "stages.sock")
	ln, err := Listen(socket)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for path, want := range map[string]os.FileMode{dir: 0o700, socket: 0o600} {
		info, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := info.Mode().Perm(); got != want {
			t.Errorf("%s: mode %04o, want %04o", path, got, want)
		}
	}
}

// A cancelled stage (the runner's SIGTERM to the stage process) is cancelled in the server, and
// what it writes while it stops still reaches the job log, with its exit code.
func TestCancellingTheClientCancelsTheStage(t *testing.T) {
	started := make(chan struct{})
	socket, _ := serving(t, func(ctx context.Context, req Request, stdout, stderr io.Writer) int {
		close(started)
		<-ctx.Done()
		fmt.Fprintln(stderr, "stage cancelled, claim released")
		return 3
	})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-started; cancel() }()
	var stderr bytes.Buffer
	code, err := forward(ctx, socket, request("prepare"), io.Discard, &stderr)
	if err != nil || code != 3 || stderr.String() != "stage cancelled, claim released\n" {
		t.Errorf("Forward = %d, %v, stderr %q; want the stage's own end", code, err, stderr.String())
	}
}

// A server that goes away mid-stage leaves the stage's outcome unknown: an error, never an exit
// code the runner would take for the stage's.
func TestAServerLostMidStageIsAnError(t *testing.T) {
	socket, log := serving(t, func(ctx context.Context, req Request, stdout, stderr io.Writer) int {
		fmt.Fprintln(stderr, "claiming")
		panic("boom")
	})
	var stderr bytes.Buffer
	code, err := forward(context.Background(), socket, request("prepare"), io.Discard, &stderr)
	if !errors.Is(err, errLost) || code != 0 {
		t.Errorf("Forward = %d, %v; want ErrLost", code, err)
	}
	if stderr.String() != "claiming\n" || !strings.Contains(log.String(), "internal error serving a stage: boom") {
		t.Errorf("stderr %q, server log %q", stderr.String(), log.String())
	}
}

func TestBadRequestsAreRefused(t *testing.T) {
	socket, log := serving(t, func(context.Context, Request, io.Writer, io.Writer) int {
		t.Error("the handler ran")
		return 0
	})
	var refused *refusedError
	if _, err := forward(context.Background(), socket, Request{Args: []string{"sandbox-executor"}, Version: "v1.2.3"}, io.Discard, io.Discard); !errors.As(err, &refused) || !strings.Contains(refused.Reason, "names no command") || !NotServed(err) {
		t.Errorf("a request without a command: %v", err)
	}
	// A stage of another build: the server was started before an upgrade.
	upgraded := request("prepare")
	upgraded.Version = "v1.3.0"
	if _, err := forward(context.Background(), socket, upgraded, io.Discard, io.Discard); !errors.As(err, &refused) || !strings.Contains(refused.Reason, "the stage is of build v1.3.0, this server of build v1.2.3: restart the server") || !NotServed(err) {
		t.Errorf("a stage of another build: %v", err)
	}
	conn, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	wire.WriteFrame(conn, frameRequest, []byte("{not json"))
	reply, _ := io.ReadAll(conn)
	conn.Close()
	if len(reply) == 0 || reply[0] != frameRefused {
		t.Errorf("a malformed request got %q", reply)
	}
	if !strings.Contains(log.String(), "bad request") {
		t.Errorf("server log %q", log.String())
	}
}

// Stopping the server lets a running stage finish within the drain time; a stage past it is
// cancelled.
func TestServeDrainsThenCancels(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "run", "stages.sock")
	ln, err := Listen(socket)
	if err != nil {
		t.Fatal(err)
	}
	running := make(chan struct{})
	srv := &Server{Drain: 50 * time.Millisecond, Version: "v1.2.3", Handler: func(ctx context.Context, req Request, stdout, stderr io.Writer) int {
		close(running)
		<-ctx.Done() // a stage that only ends when cancelled
		return 9
	}}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	forwarded := make(chan int, 1)
	go func() {
		code, _ := forward(context.Background(), socket, request("cleanup"), io.Discard, io.Discard)
		forwarded <- code
	}()
	<-running
	cancel()
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
	if code := <-forwarded; code != 9 {
		t.Errorf("the drained stage exited %d, want its own 9", code)
	}
	if _, err := os.Stat(socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket outlived the server: %v", err)
	}
}

func TestCommandIndex(t *testing.T) {
	for args, want := range map[string]int{
		"x --config c prepare": 3, "x prepare": 1, "x --config=c cleanup a": 2, "x --config": -1,
	} {
		if got := commandIndex(strings.Fields(args)); got != want {
			t.Errorf("commandIndex(%q) = %d, want %d", args, got, want)
		}
	}
}

func TestPing(t *testing.T) {
	socket, log := serving(t, func(context.Context, Request, io.Writer, io.Writer) int {
		t.Error("a ping ran a stage")
		return 0
	})
	if version, err := Ping(context.Background(), socket); err != nil || version != "v1.2.3" {
		t.Errorf("Ping = %q, %v; want the server's version\n%s", version, err, log)
	}
	if log.String() != "" {
		t.Errorf("a ping was logged: %q", log.String())
	}
	if _, err := Ping(context.Background(), filepath.Join(t.TempDir(), "none.sock")); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Ping without a server: %v", err)
	}
}

// A stage the runner cancelled before any server took it is over: Hand says so as a system
// failure, never as "not served", which would have the caller run it after all.
func TestHandACancelledStageIsNotServedElsewhere(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	nobody := filepath.Join(t.TempDir(), "stages.sock")
	_, err := Hand(ctx, nobody, Stage{Config: "/etc/x.toml", Name: "prepare"}, io.Discard, io.Discard)
	if NotServed(err) || failure.KindOf(err) != failure.KindSystem || !strings.Contains(err.Error(), "prepare cancelled before it started") {
		t.Errorf("Hand after a cancel = %v; want a system failure saying prepare was cancelled", err)
	}
}

// A client that vanishes without closing its side first (a SIGKILLed launcher, mid-run) cancels
// its stage: at the latest, the write that finds it gone cancels the stage before it returns, so
// the stage stops what it runs rather than take it for a mere output error.
func TestAVanishedClientCancelsTheStage(t *testing.T) {
	cancelledAtTheFailedWrite := make(chan bool, 1)
	socket, _ := serving(t, func(ctx context.Context, req Request, stdout, stderr io.Writer) int {
		fmt.Fprintln(stdout, "started")
		for {
			if _, err := io.WriteString(stdout, strings.Repeat("x", maxOutput)); err != nil {
				cancelledAtTheFailedWrite <- ctx.Err() != nil
				return 0
			}
		}
	})
	conn, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	payload, _ := encodeRequest(request("run", "/tmp/script", "build_script"))
	if err := wire.WriteFrame(conn, frameRequest, payload); err != nil {
		t.Fatal(err)
	}
	if kind, data, err := readFrame(bufio.NewReader(conn), maxOutput); err != nil || kind != frameStdout || string(data) != "started\n" {
		t.Fatalf("first frame %q %q, %v", kind, data, err)
	}
	// Closed with unread output pending: the peer's writes fail (EPIPE, ECONNRESET), as when
	// the launcher's process dies.
	conn.Close()
	select {
	case cancelled := <-cancelledAtTheFailedWrite:
		if !cancelled {
			t.Error("the stage's write to a vanished client failed before its context was cancelled")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stage went on writing to a vanished client")
	}
}
