package agent

import (
	"bufio"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
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
)

// The stage daemon can also serve agent commands over the pod network, so that a runner in the
// cluster runs a stage with one TCP connection instead of an exec through the API server and the
// kubelet. The request carries the same arguments an exec would, the answer the same streams,
// framed; the token handed over at prepare (stdin, never argv or env) authenticates it.

// NetworkPort is where the daemon listens in the pod when prepare asks for the network path.
const NetworkPort = 7543

// Frame types on the wire: a byte, a big-endian uint32 length, the payload.
const (
	FrameStdout byte = 1
	FrameStderr byte = 2
	FrameExit   byte = 3
)

// networkCommands are the only agent commands served over the network.
var networkCommands = []string{"start", "kill", "probe"}

func tokenPath() string { return filepath.Join(filepath.Dir(stagesDir), "token") }

// ServeNetwork serves agent commands on ln to connections that present token. A connection
// carries one command: a header line "SBX1 <token> <base64 JSON args> <stdin length>", then the
// stdin bytes; the answer is frames (stdout, stderr, exit). Plain TCP rather than HTTP keeps
// net/http, and megabytes, out of the agent copied into every pod.
func ServeNetwork(ln net.Listener, token string) error {
	tokens := &tokenBox{}
	tokens.set(token)
	return serveNetwork(ln, tokens)
}

func serveNetwork(ln net.Listener, tokens *tokenBox) error {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return err
		}
		go serveConn(conn, tokens.get())
	}
}

// RequestHeader is the first line of a network request.
func RequestHeader(token string, args []string, stdinLen int) string {
	encoded, _ := json.Marshal(args)
	return fmt.Sprintf("SBX1 %s %s %d\n", token, base64.StdEncoding.EncodeToString(encoded), stdinLen)
}

func serveConn(conn net.Conn, token string) {
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReaderSize(conn, 64<<10)
	line, err := r.ReadString('\n')
	if err != nil {
		return
	}
	fields := strings.Fields(line)
	fw := &frameWriter{w: conn}
	refuse := func(msg string) {
		_ = fw.frame(FrameStderr, []byte(msg+"\n"))
		_ = fw.frame(FrameExit, []byte(strconv.Itoa(ExitRefused)))
	}
	if token == "" || len(fields) != 4 || fields[0] != "SBX1" || subtle.ConstantTimeCompare([]byte(fields[1]), []byte(token)) != 1 {
		refuse("unauthorized")
		return
	}
	var args []string
	encoded, err := base64.StdEncoding.DecodeString(fields[2])
	if err != nil || json.Unmarshal(encoded, &args) != nil || len(args) == 0 || !slices.Contains(networkCommands, args[0]) {
		refuse("bad arguments")
		return
	}
	stdinLen, err := strconv.Atoi(fields[3])
	if err != nil || stdinLen < 0 {
		refuse("bad stdin length")
		return
	}
	_ = conn.SetReadDeadline(time.Time{})
	code := Main(args, io.LimitReader(r, int64(stdinLen)), fw.stream(FrameStdout), fw.stream(FrameStderr))
	_ = fw.frame(FrameExit, []byte(strconv.Itoa(code)))
}

// ExitRefused is the exit code of a network request the agent refused (bad token or arguments).
const ExitRefused = 126

type frameWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (f *frameWriter) frame(kind byte, p []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	buf := make([]byte, 5+len(p))
	buf[0] = kind
	binary.BigEndian.PutUint32(buf[1:5], uint32(len(p)))
	copy(buf[5:], p)
	_, err := f.w.Write(buf)
	return err
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

// ReadFrames demultiplexes a response body onto stdout and stderr and returns the command's exit
// code; io.ErrUnexpectedEOF when the stream ended before the exit frame.
func ReadFrames(r io.Reader, stdout, stderr io.Writer) (int, error) {
	var hdr [5]byte
	buf := make([]byte, 64<<10)
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
		n := int(binary.BigEndian.Uint32(hdr[1:]))
		if n > len(buf) {
			buf = make([]byte, n)
		}
		if _, err := io.ReadFull(r, buf[:n]); err != nil {
			return 0, io.ErrUnexpectedEOF
		}
		switch hdr[0] {
		case FrameStdout:
			if _, err := stdout.Write(buf[:n]); err != nil {
				return 0, err
			}
		case FrameStderr:
			if _, err := stderr.Write(buf[:n]); err != nil {
				return 0, err
			}
		case FrameExit:
			return strconv.Atoi(string(buf[:n]))
		}
	}
}

// saveToken keeps the token handed over on stdin for the daemon, which reads and removes it.
func saveToken(stdin io.Reader) error {
	data, err := io.ReadAll(io.LimitReader(stdin, 4096))
	if err != nil {
		return err
	}
	token := strings.TrimSpace(string(data))
	if len(token) < minTokenLen {
		return errors.New("the network path needs a token of at least 32 characters on stdin")
	}
	return os.WriteFile(tokenPath(), []byte(token), 0o600)
}

func takeToken() (string, error) {
	data, err := os.ReadFile(tokenPath())
	if err != nil {
		return "", err
	}
	_ = os.Remove(tokenPath())
	return strings.TrimSpace(string(data)), nil
}

// minTokenLen keeps guessable tokens out: NewAgentToken makes 64 hex characters.
const minTokenLen = 32

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
		if t := strings.TrimSpace(sc.Text()); len(t) >= minTokenLen && !strings.ContainsAny(t, " \t") {
			b.set(t)
		}
	}
}
