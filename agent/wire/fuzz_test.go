package wire_test

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
)

// countingWriter counts what it is given and fails a write over MaxFrame: a frame over the cap
// that got through would show here.
type countingWriter struct{ n int }

func (c *countingWriter) Write(p []byte) (int, error) {
	if len(p) > wire.MaxFrame {
		return 0, errors.New("a write over MaxFrame")
	}
	c.n += len(p)
	return len(p), nil
}

// FuzzReadFrames: any answer, from an agent or from whatever the job put in its place, is an
// exit code or an error, never a panic nor a frame over the cap; what WriteFrame writes reads
// back whole.
func FuzzReadFrames(f *testing.F) {
	f.Add([]byte("\x01\x00\x00\x00\x03out\x02\x00\x00\x00\x03err\x03\x00\x00\x00\x010"))
	f.Add([]byte("\x01\xff\xff\xff\xff\x00\x00\x00\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var stdout, stderr countingWriter
		code, err := wire.ReadFrames(bytes.NewReader(data), &stdout, &stderr)
		if err == nil && stdout.n+stderr.n+5 > len(data) {
			t.Fatalf("exit %d after %d bytes of output from %d bytes of input", code, stdout.n+stderr.n, len(data))
		}
		var stream bytes.Buffer
		if err := wire.WriteFrame(&stream, wire.FrameStdout, data); err != nil {
			t.Fatal(err)
		}
		_ = wire.WriteFrame(&stream, wire.FrameExit, []byte("7"))
		var out bytes.Buffer
		if code, err := wire.ReadFrames(&stream, &out, io.Discard); err != nil || code != 7 || !bytes.Equal(out.Bytes(), data) {
			t.Fatalf("round trip: %d, %v, %d of %d bytes", code, err, out.Len(), len(data))
		}
	})
}

// FuzzParseRequestHeader: a header the agent accepts has arguments and a stdin length, and one
// made of them parses the same.
func FuzzParseRequestHeader(f *testing.F) {
	f.Add(wire.RequestHeader([]string{"start", "--dir", "/tmp/x y"}, 12))
	f.Add("SBX1 tok WyJwcm9iZSJd 0\n")
	f.Add("SBX2 WyJwcm9iZSJd -1\n")
	f.Fuzz(func(t *testing.T, line string) {
		req, err := wire.ParseRequestHeader(line)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q is not one line", err)
			}
			return
		}
		if len(req.Args) == 0 || req.StdinLen < 0 {
			t.Fatalf("accepted %+v", req)
		}
		again, err := wire.ParseRequestHeader(wire.RequestHeader(req.Args, req.StdinLen))
		if err != nil || !reflect.DeepEqual(again, req) {
			t.Fatalf("round trip: %+v, %v; want %+v", again, err, req)
		}
	})
}

// FuzzParseControl: a control line the executor acts on is one the agent could have written.
func FuzzParseControl(f *testing.F) {
	f.Add(strings.TrimSuffix(wire.StatusLine(137), "\n"))
	f.Add(strings.TrimSuffix(wire.StartedLine(), "\n"))
	f.Add(strings.TrimSuffix(wire.HeartbeatLine(), "\n"))
	f.Add("status 0")
	f.Fuzz(func(t *testing.T, line string) {
		c, ok := wire.ParseControl(line)
		if !ok {
			if c != (wire.Control{}) {
				t.Fatalf("text parsed as %+v", c)
			}
			return
		}
		var again string
		switch {
		case c.Heartbeat:
			again = wire.HeartbeatLine()
		case c.Started:
			again = wire.StartedLine()
		default:
			again = wire.StatusLine(c.Status)
		}
		if got, ok := wire.ParseControl(strings.TrimSuffix(again, "\n")); !ok || got != c {
			t.Fatalf("%q parsed as %+v, which writes as %q, which parses as %+v", line, c, again, got)
		}
	})
}

// FuzzParseFirstLogLine: an identity read from a pod's log is a valid identity, and a line is
// never both an identity and a reason.
func FuzzParseFirstLogLine(f *testing.F) {
	f.Add(wire.IdentityLine(wire.IdentityOf([]byte("key"))))
	f.Add(wire.NetworkOffLine("the pod has no agent CA"))
	f.Add("sandbox-executor-agent: identity sha256:abc\n")
	f.Fuzz(func(t *testing.T, line string) {
		identity, off, ok := wire.ParseFirstLogLine(line)
		switch {
		case !ok && (identity != "" || off != ""):
			t.Fatalf("refused line gave %q, %q", identity, off)
		case identity != "" && (off != "" || !wire.ValidIdentity(identity)):
			t.Fatalf("identity %q (off %q)", identity, off)
		}
	})
}
