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
)

// ErrUnavailable is a socket nobody listens on (no server started, or it stopped): the stage
// runs in its own process instead.
var ErrUnavailable = errors.New("no stage server listening")

// ErrLost is a server that went away before the stage ended: what the stage did is unknown.
var ErrLost = errors.New("the stage server closed the connection before the stage ended")

// RefusedError is a server that would not serve the stage (another user, a bad request).
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return "the stage server refused the stage: " + e.Reason }

// Ping asks the server at socket whether it serves, and returns its version.
func Ping(ctx context.Context, socket string) (string, error) {
	conn, err := dial(ctx, socket)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	if err := writeFrame(conn, framePing, nil); err != nil {
		return "", fmt.Errorf("%w (%v)", ErrLost, err)
	}
	kind, data, err := readFrame(bufio.NewReader(conn), maxOutput)
	switch {
	case err != nil:
		return "", fmt.Errorf("%w (%v)", ErrLost, err)
	case kind == frameRefused:
		return "", &RefusedError{Reason: string(data)}
	case kind != framePong:
		return "", fmt.Errorf("%w (unknown frame %q)", ErrLost, kind)
	}
	return string(data), nil
}

// dial connects to the server at socket; ErrUnavailable when nobody listens there.
func dial(ctx context.Context, socket string) (net.Conn, error) {
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "unix", socket)
	if err == nil {
		return conn, nil
	}
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
		return nil, fmt.Errorf("%w on %s", ErrUnavailable, socket)
	}
	return nil, fmt.Errorf("stage server %s: %w", socket, err)
}

// Forward has the server at socket run req, relays its output to stdout and stderr, and returns
// the stage's exit code. When ctx ends (the runner cancels the stage), the server is told so and
// the stage there is cancelled; Forward still relays what the stage writes until it ends, as the
// stage would in this process.
func Forward(ctx context.Context, socket string, req Request, stdout, stderr io.Writer) (int, error) {
	conn, err := dial(ctx, socket)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	payload, err := encodeRequest(req)
	if err != nil {
		return 0, err
	}
	if err := writeFrame(conn, frameRequest, payload); err != nil {
		return 0, fmt.Errorf("%w (sending the stage: %v)", ErrLost, err)
	}
	// Closing the write side is the cancellation: the server cancels the stage and sends what it
	// writes until it returns, then its exit code.
	stop := context.AfterFunc(ctx, func() { _ = conn.(*net.UnixConn).CloseWrite() })
	defer stop()
	r := bufio.NewReader(conn)
	for {
		kind, data, err := readFrame(r, maxOutput)
		if err != nil {
			return 0, fmt.Errorf("%w (%v)", ErrLost, err)
		}
		switch kind {
		case frameStdout:
			_, _ = stdout.Write(data)
		case frameStderr:
			_, _ = stderr.Write(data)
		case frameExit:
			if len(data) != 4 {
				return 0, fmt.Errorf("%w (an exit frame of %d bytes)", ErrLost, len(data))
			}
			return int(int32(binary.BigEndian.Uint32(data))), nil
		case frameRefused:
			return 0, &RefusedError{Reason: string(data)}
		default:
			return 0, fmt.Errorf("%w (unknown frame %q)", ErrLost, kind)
		}
	}
}
