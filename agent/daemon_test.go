package agent_test

import (
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
)

// The job runs as the agent's user and owns BaseDir, so it can put its own server at the
// daemon's socket. A gigabyte answered there is not read whole: the stage fails, in one line.
func TestStartReadsABoundedDaemonAnswer(t *testing.T) {
	a := newAgent(t)
	ln, err := net.Listen("unix", filepath.Join(filepath.Dir(a.StagesDir()), "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	heap := testutil.WatchHeap(t, 64<<20)
	served := make(chan struct{})
	go func() {
		defer close(served)
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = io.Copy(conn, &testutil.Flood{N: 1 << 30, Fill: 'x', Stop: heap.Over})
	}()
	code, _, stderr := run(a, "true\n", startArgs(a, "s1", "true\n", false)...)
	ln.Close()
	<-served
	if peak := heap.Stop(); peak > 64<<20 {
		t.Errorf("the heap peaked at %d MiB reading the daemon's answer; want under 64 MiB", peak>>20)
	}
	if code != wire.ExitAgentFailure || !strings.Contains(stderr, "starting stage: xxx") || len(stderr) > 8<<10 {
		t.Errorf("start = %d, %d bytes of stderr (%.100q); want %d and one bounded line", code, len(stderr), stderr, wire.ExitAgentFailure)
	}
}
