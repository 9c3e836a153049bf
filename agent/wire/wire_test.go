package wire_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
)

func TestControlLinesRoundTrip(t *testing.T) {
	for line, want := range map[string]wire.Control{
		wire.StartedLine():   {Started: true},
		wire.HeartbeatLine(): {Heartbeat: true},
		wire.StatusLine(137): {Status: 137},
	} {
		got, ok := wire.ParseControl(line[:len(line)-1])
		if !ok || got != want {
			t.Errorf("ParseControl(%q) = %+v, %t; want %+v", line, got, ok, want)
		}
	}
	if _, ok := wire.ParseControl("status 0"); ok {
		t.Error("ordinary text parsed as a control line")
	}
}

func TestRequestHeaderRoundTrip(t *testing.T) {
	args := []string{"start", "--dir", "/tmp/x y", "--size", "3"}
	got, err := wire.ParseRequestHeader(wire.RequestHeader(args, 3))
	if err != nil || !reflect.DeepEqual(got.Args, args) || got.StdinLen != 3 {
		t.Fatalf("ParseRequestHeader = %+v, %v", got, err)
	}
	// SBX1 carried a token in clear: an agent of this version refuses it.
	for _, bad := range []string{"", "SBX1 tok WyJwcm9iZSJd 0\n", "SBX2 e30= 0\n", "SBX2 !!! 0\n", "SBX2 WyJwcm9iZSJd -1\n"} {
		if _, err := wire.ParseRequestHeader(bad); err == nil {
			t.Errorf("ParseRequestHeader(%q) accepted", bad)
		}
	}
}

func TestFirstLogLine(t *testing.T) {
	identity := wire.IdentityOf([]byte("a public key"))
	if !wire.ValidIdentity(identity) {
		t.Fatalf("IdentityOf made %q, which ValidIdentity refuses", identity)
	}
	got, off, ok := wire.ParseFirstLogLine(wire.IdentityLine(identity))
	if !ok || got != identity || off != "" {
		t.Errorf("identity line parsed as %q, %q, %t", got, off, ok)
	}
	got, off, ok = wire.ParseFirstLogLine(wire.NetworkOffLine("no client CA"))
	if !ok || got != "" || off != "no client CA" {
		t.Errorf("network-off line parsed as %q, %q, %t", got, off, ok)
	}
	for _, other := range []string{"", "hello", "sandbox-executor-agent: identity sha256:abc", "sandbox-executor-agent: identity " + identity[:20]} {
		if _, _, ok := wire.ParseFirstLogLine(other); ok {
			t.Errorf("ParseFirstLogLine(%q) accepted", other)
		}
	}
}

func TestFramesRoundTrip(t *testing.T) {
	var stream bytes.Buffer
	for _, f := range []struct {
		kind byte
		data string
	}{{wire.FrameStdout, "out"}, {wire.FrameStderr, "err"}, {wire.FrameStdout, "more"}, {wire.FrameExit, "3"}} {
		if err := wire.WriteFrame(&stream, f.kind, []byte(f.data)); err != nil {
			t.Fatal(err)
		}
	}
	var stdout, stderr bytes.Buffer
	code, err := wire.ReadFrames(&stream, &stdout, &stderr)
	if err != nil || code != 3 || stdout.String() != "outmore" || stderr.String() != "err" {
		t.Fatalf("ReadFrames = %d, %v, %q, %q", code, err, stdout.String(), stderr.String())
	}
	if _, err := wire.ReadFrames(bytes.NewReader([]byte{wire.FrameStdout, 0, 0, 0, 1, 'x'}), io.Discard, io.Discard); err != io.ErrUnexpectedEOF {
		t.Errorf("a stream without its exit frame: %v, want io.ErrUnexpectedEOF", err)
	}
}

// The 11 bytes fuzzing found: a frame header claiming 4 GiB. The reader used to allocate what
// the peer claimed; a frame over MaxFrame is now a protocol error, with nothing allocated.
func TestReadFramesRefusesAFrameOverTheCap(t *testing.T) {
	for _, n := range []uint32{wire.MaxFrame + 1, 1<<32 - 1} {
		input := append([]byte{wire.FrameStdout}, binary.BigEndian.AppendUint32(nil, n)...)
		input = append(input, "\x00\x00\x00\x00\x00\x00"...)
		_, err := wire.ReadFrames(bytes.NewReader(input), io.Discard, io.Discard)
		if !errors.Is(err, wire.ErrFrameTooLarge) {
			t.Errorf("a frame of %d bytes: %v, want ErrFrameTooLarge", n, err)
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("the error is not one line: %q", err)
		}
	}
}

// A write over MaxFrame goes out as several frames, so that the agent never sends a frame the
// executor refuses.
func TestWriteFrameSplitsAWriteOverTheCap(t *testing.T) {
	data := bytes.Repeat([]byte("x"), 2*wire.MaxFrame+1)
	var stream bytes.Buffer
	if err := wire.WriteFrame(&stream, wire.FrameStderr, data); err != nil {
		t.Fatal(err)
	}
	if err := wire.WriteFrame(&stream, wire.FrameExit, []byte("0")); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	code, err := wire.ReadFrames(&stream, io.Discard, &stderr)
	if err != nil || code != 0 || !bytes.Equal(stderr.Bytes(), data) {
		t.Fatalf("ReadFrames = %d, %v, %d bytes of stderr; want 0, nil, %d bytes", code, err, stderr.Len(), len(data))
	}
}

func TestReadFramesRefusesAnExitFrameThatIsNotANumber(t *testing.T) {
	var stream bytes.Buffer
	_ = wire.WriteFrame(&stream, wire.FrameExit, []byte("zero"))
	if _, err := wire.ReadFrames(&stream, io.Discard, io.Discard); err == nil {
		t.Fatal("an exit frame of text accepted")
	}
}
