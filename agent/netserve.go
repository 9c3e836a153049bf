package agent

import (
	"bufio"
	"crypto/subtle"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
)

// The daemon serves agent commands over the pod network too (wire.NetworkPort), to connections
// that present the job's token: it is handed over at prepare on stdin, never in argv or env.

// networkCommands are the only agent commands served over the network.
var networkCommands = []string{"start", "kill", "probe", "fence"}

func (a *Agent) tokenPath() string { return filepath.Join(filepath.Dir(a.stagesDir), "token") }

// ServeNetwork serves agent commands on ln to connections that present token, as the daemon does
// on the pod network once it has the job's token.
func (a *Agent) ServeNetwork(ln net.Listener, token string) error {
	tokens := &tokenBox{}
	tokens.set(token)
	return a.serveNetwork(ln, tokens)
}

func (a *Agent) serveNetwork(ln net.Listener, tokens *tokenBox) error {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return err
		}
		go a.serveConn(conn, tokens.get())
	}
}

func (a *Agent) serveConn(conn net.Conn, token string) {
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReaderSize(conn, 64<<10)
	line, err := r.ReadString('\n')
	if err != nil {
		return
	}
	fw := &frameWriter{w: conn}
	refuse := func(msg string) {
		_ = fw.frame(wire.FrameStderr, []byte(msg+"\n"))
		_ = fw.frame(wire.FrameExit, []byte(strconv.Itoa(wire.ExitRefused)))
	}
	req, err := wire.ParseRequestHeader(line)
	switch {
	case token == "" || subtle.ConstantTimeCompare([]byte(req.Token), []byte(token)) != 1:
		refuse("unauthorized")
		return
	case err != nil:
		refuse(err.Error())
		return
	case !slices.Contains(networkCommands, req.Args[0]):
		refuse("bad arguments")
		return
	}
	_ = conn.SetReadDeadline(time.Time{})
	code := a.Run(req.Args, io.LimitReader(r, int64(req.StdinLen)), fw.stream(wire.FrameStdout), fw.stream(wire.FrameStderr))
	_ = fw.frame(wire.FrameExit, []byte(strconv.Itoa(code)))
}

// frameWriter serialises the frames of one connection's streams.
type frameWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (f *frameWriter) frame(kind byte, p []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return wire.WriteFrame(f.w, kind, p)
}

type streamWriter struct {
	f    *frameWriter
	kind byte
}

func (s streamWriter) Write(p []byte) (int, error) {
	if err := s.f.frame(s.kind, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (f *frameWriter) stream(kind byte) io.Writer { return streamWriter{f, kind} }

// saveToken keeps the token handed over on stdin for the daemon, which reads and removes it.
func (a *Agent) saveToken(stdin io.Reader) error {
	data, err := io.ReadAll(io.LimitReader(stdin, 4096))
	if err != nil {
		return err
	}
	token := strings.TrimSpace(string(data))
	if len(token) < wire.MinTokenLen {
		return errors.New("the network path needs a token of at least 32 characters on stdin")
	}
	return os.WriteFile(a.tokenPath(), []byte(token), 0o600)
}

func (a *Agent) takeToken() (string, error) {
	data, err := os.ReadFile(a.tokenPath())
	if err != nil {
		return "", err
	}
	_ = os.Remove(a.tokenPath())
	return strings.TrimSpace(string(data)), nil
}

// tokenBox holds the network path's token. A pod whose agent was baked into its template gets
// the token from the executor at prepare, over attach (stdin), after the pod started: until
// then every network request is refused. A retried prepare hands over a new token, which
// replaces the old: whoever may attach to the pod may exec in it anyway.
type tokenBox struct{ v atomic.Pointer[string] }

func (b *tokenBox) get() string {
	if t := b.v.Load(); t != nil {
		return *t
	}
	return ""
}

func (b *tokenBox) set(token string) { b.v.Store(&token) }

// readFrom takes each line of r that looks like a token; anything else is ignored.
func (b *tokenBox) readFrom(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if t := strings.TrimSpace(sc.Text()); len(t) >= wire.MinTokenLen && !strings.ContainsAny(t, " \t") {
			b.set(t)
		}
	}
}
