package agent

import (
	"crypto/subtle"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// The stage daemon can also serve agent commands over the pod network, so that a runner in the
// cluster runs a stage with one HTTP request instead of an exec through the API server and the
// kubelet. The request carries the same arguments an exec would, the response the same streams,
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
var networkCommands = []string{"start", "kill"}

func tokenPath() string { return filepath.Join(filepath.Dir(stagesDir), "token") }

// NetworkHandler serves the agent commands start and kill to requests bearing token.
func NetworkHandler(token string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/exec", func(w http.ResponseWriter, r *http.Request) {
		got := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		if subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		var args []string
		if err := json.Unmarshal([]byte(r.Header.Get("Sbx-Args")), &args); err != nil || len(args) == 0 || !slices.Contains(networkCommands, args[0]) {
			http.Error(w, "bad arguments", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusOK)
		fw := &frameWriter{w: w, rc: http.NewResponseController(w)}
		code := Main(args, r.Body, fw.stream(FrameStdout), fw.stream(FrameStderr))
		_ = fw.frame(FrameExit, []byte(strconv.Itoa(code)))
	})
	return mux
}

type frameWriter struct {
	mu sync.Mutex
	w  io.Writer
	rc *http.ResponseController
}

func (f *frameWriter) frame(kind byte, p []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var hdr [5]byte
	hdr[0] = kind
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(p)))
	if _, err := f.w.Write(hdr[:]); err != nil {
		return err
	}
	if _, err := f.w.Write(p); err != nil {
		return err
	}
	return f.rc.Flush()
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
	if len(token) < 32 {
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
