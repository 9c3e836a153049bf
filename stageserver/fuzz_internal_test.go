package stageserver

import (
	"bufio"
	"bytes"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
)

// FuzzReadFrame: whatever reaches the stage server's socket (a peer of its own user) is frames
// within their limit, a request the server can act on, or an error, never a panic nor an
// allocation over the limit; a request written by the client reads back the same.
func FuzzReadFrame(f *testing.F) {
	req := Request{Args: []string{"sandbox-executor", "--config", "/etc/c.toml", "prepare"}, Environ: []string{"A=b"}, Started: time.Unix(1700000000, 0).UTC(), Version: "v1"}
	payload, err := encodeRequest(req)
	if err != nil {
		f.Fatal(err)
	}
	var seed bytes.Buffer
	_ = wire.WriteFrame(&seed, frameRequest, payload)
	f.Add(seed.Bytes())
	f.Add([]byte{framePing, 0, 0, 0, 0})
	f.Add([]byte{frameRequest, 0xff, 0xff, 0xff, 0xff, '{'})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bufio.NewReader(bytes.NewReader(data))
		for {
			kind, payload, err := readFrame(r, maxRequest)
			if err != nil {
				break
			}
			if len(payload) > maxRequest {
				t.Fatalf("a frame of %d bytes over the limit", len(payload))
			}
			if kind != frameRequest {
				continue
			}
			if got, err := decodeRequest(payload); err == nil && len(got.Args) < 2 {
				t.Fatalf("accepted a request that names no command: %+v", got)
			}
		}
		var stream bytes.Buffer
		if err := wire.WriteFrames(&stream, frameStdout, data, maxRequest); err != nil {
			t.Fatal(err)
		}
		kind, payload, err := readFrame(bufio.NewReader(&stream), maxRequest)
		if len(data) <= maxRequest && (err != nil || kind != frameStdout || !bytes.Equal(payload, data)) {
			t.Fatalf("round trip: %q, %v", kind, err)
		}
	})
}
