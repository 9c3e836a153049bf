// Package stageserver keeps the executor warm across the stage processes the runner starts.
//
// The custom executor protocol starts a new process for every stage, and every new process pays
// for Go's initialisation, a new TLS connection to the API server and cold caches before it does
// its work. `sandbox-executor serve` is a long-running process beside gitlab-runner (same host or
// container, same user) that listens on a Unix socket; a stage that may go through it (prepare,
// run, cleanup) sends it its invocation (arguments, environment, start time) and relays what it writes
// and its exit code. The server runs the stage with connections and caches that outlive a job.
//
// The socket is local and private: it lives in a directory only its owner can enter, the socket
// itself is 0600, and the server answers only peers of its own user, not even root (SO_PEERCRED). What
// crosses it (the stage's environment, which holds the job's variables) never touches a network.
// A stage that cannot reach the server (no socket, nobody listening) runs in its own process, as
// without one; a server that goes away mid-stage is a system failure, which the runner retries.
package stageserver

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/internal/environ"
)

// Request is one stage invocation handed to the server.
type Request struct {
	// Args is the command line, program name first, with an absolute --config.
	Args []string `json:"args"`
	// Environ is the stage's environment as the runner gave it (KEY=value).
	Environ []string `json:"environ"`
	// Started is when the stage's process started: the start of what the stage costs the job.
	Started time.Time `json:"started"`
	// Version is the stage's build: a server of another build refuses the stage, which then runs
	// in its own process (a server started before an upgrade runs the old code).
	Version string `json:"version"`
}

// Getenv looks a variable up in the request's environment.
func (r *Request) Getenv(name string) string { return environ.Lookup(r.Environ, name) }

// Frame kinds on the socket: the request (client to server), then output and the exit code, or
// a refusal (server to client).
const (
	frameRequest byte = 'q'
	frameStdout  byte = 'o'
	frameStderr  byte = 'e'
	frameExit    byte = 'x'
	// frameRefused ends a connection the server will not serve, with the reason.
	frameRefused byte = 'r'
	// framePing asks a server whether it serves (doctor); framePong answers with its version.
	framePing byte = 'p'
	framePong byte = 'P'
)

// requestTimeout bounds sending and receiving the request: a stage sends it at once, and a
// server reads it at once.
const requestTimeout = 10 * time.Second

// maxRequest bounds a request frame: a job's environment, with all its variables, is far smaller.
const maxRequest = 16 << 20

// maxOutput bounds one output frame (writes are split to fit).
const maxOutput = 64 << 10

// readFrame reads one frame of at most limit bytes.
func readFrame(r *bufio.Reader, limit int) (byte, []byte, error) {
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(head[1:])
	if int64(n) > int64(limit) {
		return 0, nil, fmt.Errorf("frame of %d bytes is over the limit of %d", n, limit)
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, unexpectedEOF(err)
	}
	return head[0], payload, nil
}

func unexpectedEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

func encodeRequest(req Request) ([]byte, error) { return json.Marshal(req) }

func decodeRequest(data []byte) (Request, error) {
	var req Request
	if err := json.Unmarshal(data, &req); err != nil {
		return Request{}, fmt.Errorf("decoding the request: %w", err)
	}
	if len(req.Args) < 2 {
		return Request{}, errors.New("the request names no command")
	}
	return req, nil
}

// frameWriter is one output stream of a stage, written as frames of its kind; both streams of a
// stage share the connection, hence the lock.
type frameWriter struct {
	mu   *sync.Mutex
	w    io.Writer
	kind byte
	// gone, if set, is called when a write fails: the client is gone.
	gone func()
}

func (f frameWriter) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	written := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), maxOutput)]
		if err := wire.WriteFrame(f.w, f.kind, chunk); err != nil {
			if f.gone != nil {
				f.gone()
			}
			return written, err
		}
		written += len(chunk)
		p = p[len(chunk):]
	}
	return written, nil
}
