// Package stageservertest runs a stage server (package stageserver) in a test, for the tests of
// what talks to one: the stage launcher, doctor.
package stageservertest

import (
	"context"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/testutil"
	"github.com/sandbox-executor/sandbox-executor/stageserver"
)

// Serve serves stages with handler on socket, as a server of version, until the test ends, and
// returns the server's log.
func Serve(t testing.TB, socket, version string, handler stageserver.Handler) *testutil.LockedBuffer {
	t.Helper()
	ln, err := stageserver.Listen(socket)
	if err != nil {
		t.Fatal(err)
	}
	log := &testutil.LockedBuffer{}
	srv := &stageserver.Server{Handler: handler, Drain: 5 * time.Second, Log: log, Version: version}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return log
}
