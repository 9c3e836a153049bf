// Package netnstest gives tests an OS thread with a network namespace of its own, so that what
// they do to the network (sockets, netfilter tables, links and addresses made by commands)
// never reaches the host's namespace. Linux only; the tests need root.
package netnstest

import (
	"net"
	"os/exec"
	"runtime"
	"syscall"
	"testing"
)

// Thread runs functions on one OS thread that has a network namespace of its own: sockets,
// netfilter calls and commands started from it live in that namespace. The thread is never
// unlocked, so the runtime discards it when the test ends.
type Thread struct {
	// Tid is the thread's ID, for commands that name its namespace (ip link ... netns TID).
	Tid  int
	work chan func()
}

// New starts a Thread in a new network namespace, or skips the test when this kernel or user
// cannot make one. The thread ends with the test.
func New(t testing.TB) *Thread {
	t.Helper()
	ns := &Thread{work: make(chan func())}
	started := make(chan error)
	go func() {
		runtime.LockOSThread()
		if err := syscall.Unshare(syscall.CLONE_NEWNET); err != nil {
			started <- err
			return
		}
		ns.Tid = syscall.Gettid()
		started <- nil
		for f := range ns.work {
			f()
		}
	}()
	if err := <-started; err != nil {
		t.Skipf("cannot make a network namespace: %v", err)
	}
	t.Cleanup(func() { close(ns.work) })
	return ns
}

// Do runs f on the namespace's thread and returns when it has.
func (ns *Thread) Do(f func()) {
	done := make(chan struct{})
	ns.work <- func() { defer close(done); f() }
	<-done
}

// Sh runs commands in the namespace, failing the test on the first that fails.
func (ns *Thread) Sh(t testing.TB, commands ...string) {
	t.Helper()
	ns.Do(func() { Sh(t, commands...) })
}

// Listen accepts and closes TCP connections on addr in the namespace until the test ends.
func (ns *Thread) Listen(t testing.TB, addr string) {
	t.Helper()
	var l net.Listener
	var err error
	ns.Do(func() { l, err = net.Listen("tcp", addr) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
}

// Sh runs commands with sh -c in the caller's namespace, failing the test on the first that
// fails.
func Sh(t testing.TB, commands ...string) {
	t.Helper()
	for _, c := range commands {
		if out, err := exec.Command("sh", "-c", c).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", c, err, out)
		}
	}
}
