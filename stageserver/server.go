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

// requestTimeout bounds how long a connection may take to send its request: a stage sends it
// at once.
const requestTimeout = 10 * time.Second

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

// privateDir makes dir if missing and insists that no other user can enter it: the socket's own
// mode is set only after it is bound.
func privateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("stage server directory: %w", err)
	}
	info, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("stage server directory: %w", err)
	}
	if info.Mode().Perm()&0o077 == 0 {
		return nil
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("stage server directory %s is open to other users (mode %04o) and cannot be made private (%v): put the socket in a directory of its own", dir, info.Mode().Perm(), errors.Unwrap(err))
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
	var running sync.WaitGroup
	accepted := make(chan error, 1)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				accepted <- err
				return
			}
			running.Add(1)
			go func() {
				defer running.Done()
				s.serveConn(stages, conn)
			}()
		}
	}()
	var err error
	select {
	case <-ctx.Done():
		_ = ln.Close()
		<-accepted
	case err = <-accepted:
		err = fmt.Errorf("stage server: %w", err)
	}
	done := make(chan struct{})
	go func() { running.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.Drain):
		s.logf("stage server: stages still running after %s: cancelling them", s.Drain)
		cancelStages()
		<-done
	}
	return err
}

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
		_ = writeFrame(conn, frameRefused, []byte(err.Error()))
		return
	}
	r := bufio.NewReader(conn)
	_ = conn.SetReadDeadline(time.Now().Add(requestTimeout))
	kind, payload, err := readFrame(r, maxRequest)
	if err == nil && kind == framePing {
		_ = writeFrame(conn, framePong, []byte(s.Version))
		return
	}
	if err == nil && kind != frameRequest {
		err = fmt.Errorf("expected a request, got frame %q", kind)
	}
	var req Request
	if err == nil {
		req, err = decodeRequest(payload)
	}
	if err != nil {
		s.logf("stage server: bad request: %v", err)
		_ = writeFrame(conn, frameRefused, []byte(err.Error()))
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
	var mu sync.Mutex
	start := time.Now()
	code := s.Handler(ctx, req, frameWriter{mu: &mu, w: conn, kind: frameStdout}, frameWriter{mu: &mu, w: conn, kind: frameStderr})
	verb := "stage"
	if i := commandIndex(req.Args); i > 0 {
		verb = req.Args[i]
	}
	// Logged before the exit code goes out: once the client has it, the job may move on.
	s.logf("stage server: %s exited %d in %s", verb, code, time.Since(start).Round(time.Millisecond))
	var exit [4]byte
	binary.BigEndian.PutUint32(exit[:], uint32(int32(code)))
	mu.Lock()
	err = writeFrame(conn, frameExit, exit[:])
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
