package stageserver

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
)

// ErrUnavailable is a socket nobody listens on (no server started, or it stopped): the stage
// runs in its own process instead.
var ErrUnavailable = errors.New("no stage server listening")

// NotServed says whether err means the server did not take the stage at all, so that it can run
// in its own process: nobody listening, a server of another user (which is handed nothing), or
// one that refused it before running anything (another build, another user).
func NotServed(err error) bool {
	var refused *refusedError
	return errors.Is(err, ErrUnavailable) || errors.Is(err, errForeign) || errors.As(err, &refused)
}

// errForeign is a server of another user on the socket: it is handed nothing.
var errForeign = errors.New("the stage server is not this user's")

// cancelGrace bounds how long a cancelled stage may take to end in the server before the
// connection is dropped (errLost); the runner kills the stage's process before that anyway
// (graceful_kill_timeout).
const cancelGrace = time.Minute

// errLost is a server that went away before the stage ended: what the stage did is unknown.
var errLost = errors.New("the stage server closed the connection before the stage ended")

// refusedError is a server that would not serve the stage (another user, a bad request).
type refusedError struct{ Reason string }

func (e *refusedError) Error() string { return "the stage server refused the stage: " + e.Reason }

// Ping asks the server at socket whether it serves, and returns its version.
func Ping(ctx context.Context, socket string) (string, error) {
	conn, err := dial(ctx, socket)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	if err := wire.WriteFrame(conn, framePing, nil); err != nil {
		return "", fmt.Errorf("%w (%v)", errLost, err)
	}
	kind, data, err := readFrame(bufio.NewReader(conn), maxOutput)
	switch {
	case err != nil:
		return "", fmt.Errorf("%w (%v)", errLost, err)
	case kind == frameRefused:
		return "", &refusedError{Reason: string(data)}
	case kind != framePong:
		return "", fmt.Errorf("%w (unknown frame %q)", errLost, kind)
	}
	return string(data), nil
}

// dial connects to the server at socket: ErrUnavailable when nobody listens there, errForeign
// when the one listening is not of this user.
func dial(ctx context.Context, socket string) (net.Conn, error) {
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "unix", socket)
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
		return nil, fmt.Errorf("%w on %s", ErrUnavailable, socket)
	}
	if err != nil {
		return nil, fmt.Errorf("stage server %s: %w", socket, err)
	}
	if err := checkPeer(conn); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("%w: %s: %v", errForeign, socket, err)
	}
	return conn, nil
}

// forward has the server at socket run req, relays its output to stdout and stderr, and returns
// the stage's exit code. When ctx ends (the runner cancels the stage), the server is told so and
// the stage there is cancelled; forward still relays what the stage writes until it ends, as the
// stage would in this process.
func forward(ctx context.Context, socket string, req Request, stdout, stderr io.Writer) (int, error) {
	conn, err := dial(ctx, socket)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	payload, err := encodeRequest(req)
	if err != nil {
		return 0, err
	}
	// Closing the write side is the cancellation: the server cancels the stage and sends what it
	// writes until it returns, then its exit code. A server that does not end it in time is lost.
	stop := context.AfterFunc(ctx, func() {
		_ = conn.(*net.UnixConn).CloseWrite()
		time.AfterFunc(cancelGrace, func() { _ = conn.Close() })
	})
	defer stop()
	_ = conn.SetWriteDeadline(time.Now().Add(requestTimeout))
	// One frame, however large the job's environment: the server reads the request as one.
	if err := wire.WriteFrames(conn, frameRequest, payload, maxRequest); err != nil {
		if ctx.Err() != nil {
			return 0, ctx.Err() // nothing reached the server: nothing ran
		}
		return 0, fmt.Errorf("%w (sending the stage: %v)", errLost, err)
	}
	r := bufio.NewReader(conn)
	for {
		kind, data, err := readFrame(r, maxOutput)
		if err != nil {
			return 0, fmt.Errorf("%w (%v)", errLost, err)
		}
		switch kind {
		case frameStdout:
			_, _ = stdout.Write(data)
		case frameStderr:
			_, _ = stderr.Write(data)
		case frameExit:
			if len(data) != 4 {
				return 0, fmt.Errorf("%w (an exit frame of %d bytes)", errLost, len(data))
			}
			return int(int32(binary.BigEndian.Uint32(data))), nil
		case frameRefused:
			return 0, &refusedError{Reason: string(data)}
		default:
			return 0, fmt.Errorf("%w (unknown frame %q)", errLost, kind)
		}
	}
}
