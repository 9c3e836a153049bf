package stageserver

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
)

// Handler runs one stage invocation, writing its output to stdout and stderr, and returns the
// stage's exit code. ctx ends when the stage's process is cancelled (the runner's SIGTERM) or
// the server stops.
type Handler func(ctx context.Context, req Request, stdout, stderr io.Writer) int

// Server serves stage invocations on a Unix socket.
type Server struct {
	Handler Handler
	// Drain bounds how long the stages still running may take to finish once the server is told
	// to stop; then they are cancelled, as the runner cancels a stage.
	Drain time.Duration
	// Log gets one line per stage served and per connection refused (no job data: the command,
	// its exit code and how long it took).
	Log io.Writer
	// Version is the server's build, which Ping reports: a server started before an upgrade
	// still runs the old build.
	Version string
}

// Listen makes the server's socket at path: in a directory only this user can enter (made if
// missing), mode 0600, replacing a socket nobody listens on any more (a server that died).
func Listen(path string) (*net.UnixListener, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("stage server socket %q: the path must be absolute", path)
	}
	dir := filepath.Dir(path)
	if err := privateDir(dir); err != nil {
		return nil, err
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("stage server: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("stage server: %w", err)
	}
	ln.SetUnlinkOnClose(true)
	return ln, nil
}

// privateDir makes dir (mode 0700) if missing, and otherwise insists that it is this user's and
// that no other user can enter it: the socket's own mode is set only after it is bound. A
// directory that is not private is refused, never changed: it may be /tmp or /run.
func privateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("stage server directory: %w", err)
	}
	info, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("stage server directory: %w", err)
	}
	if owner, ok := ownerOf(info); ok && owner != os.Geteuid() {
		return fmt.Errorf("stage server directory %s belongs to uid %d, not to this user (uid %d): put the socket in a directory of its own", dir, owner, os.Geteuid())
	}
	if perm := info.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("stage server directory %s is open to other users (mode %04o): put the socket in a directory of its own (it is made with mode 0700)", dir, perm)
	}
	return nil
}

// removeStale removes a socket left by a server that is gone; a live one, or a file that is not
// a socket, is an error.
func removeStale(path string) error {
	info, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stage server: %w", err)
	}
	if info.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("stage server socket %s exists and is not a socket", path)
	}
	conn, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		_ = conn.Close()
		return fmt.Errorf("stage server socket %s: another server is listening on it", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("stage server socket %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("stage server: %w", err)
	}
	return nil
}

// Serve answers connections on ln until ctx ends, then stops accepting, lets the stages still
// running finish for up to Drain, cancels the rest, and returns once all have ended.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	stages, cancelStages := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelStages()
	stopAccepting := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stopAccepting()
	var running sync.WaitGroup
	var mu sync.Mutex
	open := map[net.Conn]bool{}
	var err error
	delay := time.Duration(0)
	for {
		conn, acceptErr := ln.Accept()
		if acceptErr != nil {
			if ctx.Err() != nil {
				break
			}
			if errors.Is(acceptErr, net.ErrClosed) {
				err = fmt.Errorf("stage server: %w", acceptErr)
				break
			}
			// Out of file descriptors, say: stages queue on the socket meanwhile, so try again
			// rather than leave a socket that nobody serves.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.logf("stage server: accepting a connection: %v; trying again in %s", acceptErr, delay)
			select {
			case <-ctx.Done():
			case <-time.After(delay):
			}
			continue
		}
		delay = 0
		mu.Lock()
		open[conn] = true
		mu.Unlock()
		running.Add(1)
		go func() {
			defer running.Done()
			s.serveConn(stages, conn)
			mu.Lock()
			delete(open, conn)
			mu.Unlock()
		}()
	}
	_ = ln.Close()
	done := make(chan struct{})
	go func() { running.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.Drain):
		s.logf("stage server: stages still running after %s: cancelling them", s.Drain)
		cancelStages()
		select {
		case <-done:
		case <-time.After(stopGrace):
			// A stage stuck writing to a client that does not read ends with its connection.
			s.logf("stage server: stages still running %s after their cancellation: closing their connections", stopGrace)
			mu.Lock()
			for conn := range open {
				_ = conn.Close()
			}
			mu.Unlock()
			<-done
		}
	}
	return err
}

// stopGrace is how long cancelled stages get to write their end before the server stops.
const stopGrace = 10 * time.Second

// serveConn runs the one stage a connection asks for.
func (s *Server) serveConn(base context.Context, conn net.Conn) {
	defer conn.Close()
	defer func() {
		// The client sees the connection close without an exit code: a system failure there.
		if p := recover(); p != nil {
			s.logf("stage server: internal error serving a stage: %v", p)
		}
	}()
	if err := checkPeer(conn); err != nil {
		s.logf("stage server: refused a connection: %v", err)
		_ = wire.WriteFrame(conn, frameRefused, []byte(err.Error()))
		return
	}
	r := bufio.NewReader(conn)
	_ = conn.SetReadDeadline(time.Now().Add(requestTimeout))
	kind, payload, err := readFrame(r, maxRequest)
	if err == nil && kind == framePing {
		_ = wire.WriteFrame(conn, framePong, []byte(s.Version))
		return
	}
	if err == nil && kind != frameRequest {
		err = fmt.Errorf("expected a request, got frame %q", kind)
	}
	var req Request
	if err == nil {
		req, err = decodeRequest(payload)
	}
	if err == nil && req.Version != s.Version {
		err = fmt.Errorf("the stage is of build %s, this server of build %s: restart the server after an upgrade", req.Version, s.Version)
	}
	if err != nil {
		s.logf("stage server: bad request: %v", err)
		_ = wire.WriteFrame(conn, frameRefused, []byte(err.Error()))
		return
	}
	_ = conn.SetReadDeadline(time.Time{})
	ctx, cancel := context.WithCancel(base)
	defer cancel()
	// The client closes its side when its stage is cancelled (the runner's SIGTERM) or killed:
	// the stage here is cancelled with it.
	go func() {
		_, _ = io.Copy(io.Discard, r)
		cancel()
	}()
	// A client that cannot be written to is gone too (a SIGKILLed launcher): the write that finds
	// it so cancels the stage before it returns, so that the stage sees its cancellation, not only
	// a failed write, and stops what it runs (a run stage's script in the pod) as on a cancel.
	var mu sync.Mutex
	start := time.Now()
	stdout := frameWriter{mu: &mu, w: conn, kind: frameStdout, gone: cancel}
	stderr := frameWriter{mu: &mu, w: conn, kind: frameStderr, gone: cancel}
	code := s.Handler(ctx, req, stdout, stderr)
	verb := "stage"
	if i := commandIndex(req.Args); i > 0 {
		verb = req.Args[i]
	}
	// Logged before the exit code goes out: once the client has it, the job may move on.
	s.logf("stage server: %s exited %d in %s", verb, code, time.Since(start).Round(time.Millisecond))
	var exit [4]byte
	binary.BigEndian.PutUint32(exit[:], uint32(int32(code)))
	mu.Lock()
	err = wire.WriteFrame(conn, frameExit, exit[:])
	mu.Unlock()
	if err != nil {
		s.logf("stage server: the client of that %s was gone before its exit code (%v)", verb, err)
	}
}

// commandIndex is the index of the command in args: the first argument that is neither a flag
// nor a flag's value (only --config takes one before the command).
func commandIndex(args []string) int {
	for i := 1; i < len(args); i++ {
		switch a := args[i]; {
		case a == "--config" || a == "-config":
			i++
		case len(a) > 0 && a[0] == '-':
		default:
			return i
		}
	}
	return -1
}

func (s *Server) logf(format string, args ...any) {
	if s.Log != nil {
		fmt.Fprintf(s.Log, format+"\n", args...)
	}
}
