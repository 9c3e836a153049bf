package netfence

import (
	"errors"
	"strings"
	"syscall"
	"testing"
)

// The answers of the runtimes ProveRuntime tells apart, as their probe children report them.
var (
	refusedSockets = []probeResult{
		{probePacketRaw, int(syscall.EPERM)}, {probePacketDgram, int(syscall.EPERM)},
		{probeInetRaw, int(syscall.EPERM)}, {probeInet6Raw, int(syscall.EPERM)},
	}
	grantedSockets = []probeResult{{probePacketRaw, 0}, {probePacketDgram, 0}, {probeInetRaw, 0}, {probeInet6Raw, 0}}
	refusedReplace = []probeResult{{probeReplace4, int(syscall.EPERM)}, {probeReplace6, int(syscall.EPERM)}}
	// gVisor before release-20260216.0 let the request past, to its unknown table: EINVAL.
	grantedReplace = []probeResult{{probeReplace4, int(syscall.EINVAL)}, {probeReplace6, int(syscall.EINVAL)}}
)

func withProbes(t *testing.T, report probeReport) {
	t.Helper()
	runProbes = func() probeReport { return report }
	t.Cleanup(func() { runProbes = runtimeProbes })
}

func concat(lists ...[]probeResult) []probeResult {
	var all []probeResult
	for _, l := range lists {
		all = append(all, l...)
	}
	return all
}

// A runtime that refuses every probe is proven, with or without IPv6 and AF_PACKET.
func TestProveRuntimePassesARuntimeThatRefuses(t *testing.T) {
	for name, results := range map[string][]probeResult{
		"every probe refused": concat(refusedSockets, refusedReplace),
		"no IPv6": {{probePacketRaw, int(syscall.EPERM)}, {probePacketDgram, int(syscall.EPERM)}, {probeInetRaw, int(syscall.EPERM)},
			{probeInet6Raw, int(syscall.EAFNOSUPPORT)}, {probeReplace4, int(syscall.EPERM)}},
		"no AF_PACKET, EACCES for raw": {{probePacketRaw, int(syscall.EAFNOSUPPORT)}, {probePacketDgram, int(syscall.EAFNOSUPPORT)}, {probeInetRaw, int(syscall.EACCES)},
			{probeInet6Raw, int(syscall.EACCES)}, {probeReplace4, int(syscall.EPERM)}, {probeReplace6, int(syscall.EPERM)}},
	} {
		withProbes(t, probeReport{Results: results})
		if err := ProveRuntime(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// Every runtime not proven fails closed, in one line that names MinRunsc and what it saw.
func TestProveRuntimeFailsClosed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		report probeReport
		want   []string
	}{{
		name:   "runsc before release-20251215.0: both",
		report: probeReport{Results: concat(grantedSockets, grantedReplace)},
		want: []string{"this runtime lets a job rewrite the netstack fence: a process in a new user namespace got an AF_PACKET SOCK_RAW socket, an AF_PACKET SOCK_DGRAM socket, an AF_INET SOCK_RAW socket, an AF_INET6 SOCK_RAW socket (CAP_NET_RAW in its own user namespace was enough)",
			"a process without CAP_NET_ADMIN got EINVAL (invalid argument) to IPT_SO_SET_REPLACE, not EPERM (no CAP_NET_ADMIN check)",
			"a process without CAP_NET_ADMIN got EINVAL (invalid argument) to IP6T_SO_SET_REPLACE, not EPERM"},
	}, {
		name:   "runsc from release-20251215.0 to release-20260209.1: the replace",
		report: probeReport{Results: concat(refusedSockets, grantedReplace)},
		want:   []string{"this runtime lets a job rewrite the netstack fence: a process without CAP_NET_ADMIN got EINVAL (invalid argument) to IPT_SO_SET_REPLACE"},
	}, {
		name:   "one socket granted",
		report: probeReport{Results: concat([]probeResult{{probePacketRaw, int(syscall.EPERM)}, {probePacketDgram, 0}, {probeInetRaw, int(syscall.EPERM)}}, refusedReplace)},
		want:   []string{"a process in a new user namespace got an AF_PACKET SOCK_DGRAM socket (CAP_NET_RAW"},
	}, {
		name:   "a replace granted outright",
		report: probeReport{Results: concat(refusedSockets, []probeResult{{probeReplace4, 0}})},
		want:   []string{"got success to IPT_SO_SET_REPLACE, not EPERM"},
	}, {
		name:   "a probe that could not be made",
		report: probeReport{Results: refusedReplace, Unproven: []string{"raw and packet sockets in a new user namespace: a child in one holding CAP_NET_RAW: fork/exec /agent: invalid argument; a thread unsharing one: unshare(CLONE_NEWUSER) on one thread: invalid argument"}},
		want:   []string{"cannot prove this runtime keeps a job from rewriting the netstack fence: raw and packet sockets in a new user namespace: a child in one holding CAP_NET_RAW: fork/exec /agent: invalid argument; a thread unsharing one"},
	}, {
		name:   "an answer that says neither",
		report: probeReport{Results: concat(refusedSockets[:3], []probeResult{{probeReplace4, int(syscall.ENOPROTOOPT)}})},
		want:   []string{"cannot prove this runtime keeps a job from rewriting the netstack fence: IPT_SO_SET_REPLACE without CAP_NET_ADMIN: ENOPROTOOPT"},
	}, {
		name:   "a socket answer that says neither",
		report: probeReport{Results: concat([]probeResult{{probePacketRaw, int(syscall.ENOMEM)}}, refusedSockets[1:], refusedReplace)},
		want:   []string{"an AF_PACKET SOCK_RAW socket in a new user namespace: errno"},
	}, {
		name:   "no answers",
		report: probeReport{},
		want:   []string{"an AF_PACKET SOCK_RAW socket: no answer; an AF_PACKET SOCK_DGRAM socket: no answer; an AF_INET SOCK_RAW socket: no answer; IPT_SO_SET_REPLACE: no answer"},
	}, {
		name:   "no IPv4 replace answer",
		report: probeReport{Results: refusedSockets},
		want:   []string{"IPT_SO_SET_REPLACE: no answer"},
	}} {
		withProbes(t, tc.report)
		err := ProveRuntime()
		var re *RuntimeError
		if !errors.As(err, &re) {
			t.Errorf("%s: %v, want a *RuntimeError", tc.name, err)
			continue
		}
		line := err.Error()
		want := append(tc.want, "; netfence needs runsc "+MinRunsc+" or later (docs/install.md), or set the chart's jobDefaults.netstackFence.enabled=false")
		for _, w := range want {
			if !strings.Contains(line, w) {
				t.Errorf("%s: %q\nwant it to contain %q", tc.name, line, w)
			}
		}
		if strings.ContainsAny(line, "\n\r") || !strings.HasSuffix(line, "enabled=false") {
			t.Errorf("%s: %q is not one line ending with the fix", tc.name, line)
		}
	}
}
