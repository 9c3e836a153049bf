package netfence

import (
	"fmt"
	"strings"
	"syscall"
)

// MinRunsc is the oldest gVisor release whose runsc keeps a job from rewriting the netstack
// fence, the release ProveRuntime asks for when it cannot prove the runtime does:
//
//   - release-20251215.0 checks CAP_NET_RAW for raw and packet sockets in the user namespace
//     that owns the network namespace (gVisor 8b2421490927, "socket(): Check for CAP_NET_RAW in
//     the netns-owning userns"). Before it, CAP_NET_RAW in the caller's own user namespace was
//     enough, and a job's unshare(CLONE_NEWUSER) has that.
//   - release-20260216.0 checks CAP_NET_ADMIN for IPT_SO_SET_REPLACE and IP6T_SO_SET_REPLACE
//     (gVisor 813e3124c3d7, "netstack: Added check for CAP_NET_ADMIN for get/setsockopt").
//     Before it, any raw socket could replace the filter table.
//
// Together, on an older runsc a job with no capability at all could open a raw socket in a user
// namespace of its own and write the sandbox's filter table with it: docs/security.md.
const MinRunsc = "release-20260216.0"

// ProbeRoleEnv, in a child of the netfence verb, names the probe the child runs instead of the
// verb (see ProveRuntime): the agent re-executes itself to probe the runtime in a process whose
// credentials it can change without changing its own.
const ProbeRoleEnv = "SANDBOX_EXECUTOR_NETFENCE_PROBE"

// The probe children's roles.
const (
	// roleUserns: started in a new user namespace, no IDs mapped, holding CAP_NET_RAW there as
	// an ambient capability, it asks for raw and packet sockets.
	roleUserns = "userns"
	// roleUnshare: the same from one thread that unshares a user namespace of its own, for a
	// runtime without ambient capabilities (gVisor before release-20260615.0), where no process
	// keeps a capability across execve into an unmapped user namespace. gVisor keeps
	// credentials per thread and lets one thread of many unshare its user namespace; Linux does
	// not (EINVAL).
	roleUnshare = "unshare"
	// roleNoAdmin: holding CAP_NET_RAW but not CAP_NET_ADMIN, it asks to replace a table on a
	// raw socket.
	roleNoAdmin = "noadmin"
)

// The probes, in the words of the failure line.
const (
	probePacketRaw   = "an AF_PACKET SOCK_RAW socket"
	probePacketDgram = "an AF_PACKET SOCK_DGRAM socket"
	probeInetRaw     = "an AF_INET SOCK_RAW socket"
	probeInet6Raw    = "an AF_INET6 SOCK_RAW socket"
	probeReplace4    = "IPT_SO_SET_REPLACE"
	probeReplace6    = "IP6T_SO_SET_REPLACE"
)

// requiredProbes must each have an answer for the runtime to be proven. The others are
// answered where the runtime has the family (IPv6: Apply writes its table only if it does).
var requiredProbes = []string{probePacketRaw, probePacketDgram, probeInetRaw, probeReplace4}

// probeTableName names the table each replace probe asks for. No kernel has a table of that
// name, so a runtime that lets the request past its capability check refuses it at once (gVisor
// and Linux, EINVAL) and no table changes: the probe proves the check without touching the fence.
const probeTableName = "netfence-probe"

// probeResult is one probe's answer, as a probe child reports it.
type probeResult struct {
	Probe string `json:"probe"` // one of the probe names above
	Errno int    `json:"errno"` // the runtime's answer; 0: it granted the request
}

// probeReport is what the probes saw: each answer, and why any probe could not be made.
type probeReport struct {
	Results  []probeResult
	Unproven []string
}

// runProbes runs the probes; a test stands in the answers of another runtime.
var runProbes = runtimeProbes

// RuntimeError is ProveRuntime's answer when the runtime is not proven to keep a job from
// rewriting the netstack fence: what it granted that it must refuse, and what could not be
// proven either way. Both fail the verb: a fence that a job may rewrite is not one.
type RuntimeError struct {
	// Granted lists each request the runtime granted, or let past its capability check.
	Granted []string
	// Unproven lists each probe that could not be made, or had an answer that says neither.
	Unproven []string
}

// Error is one line naming what was seen and the runsc release netfence needs.
func (e *RuntimeError) Error() string {
	var what []string
	if len(e.Granted) > 0 {
		what = append(what, "this runtime lets a job rewrite the netstack fence: "+strings.Join(e.Granted, "; "))
	}
	if len(e.Unproven) > 0 {
		what = append(what, "cannot prove this runtime keeps a job from rewriting the netstack fence: "+strings.Join(e.Unproven, "; "))
	}
	line := strings.Join(what, "; and ") + "; netfence needs runsc " + MinRunsc + " or later (docs/install.md), or set the chart's jobDefaults.netstackFence.enabled=false"
	return strings.Join(strings.Fields(line), " ")
}

// ProveRuntime proves, before netfence writes a table, that this runtime refuses what would let
// a job rewrite it: raw and packet sockets to a process in a new user namespace, however many
// capabilities it holds there, and a filter-table replace (IPT_SO_SET_REPLACE, IPv6's too) to a
// process without CAP_NET_ADMIN. Each probe runs in a child, this binary re-executed with
// ProbeRoleEnv, whose credentials it changes; none changes a table. It returns nil when every
// probe was refused, else a *RuntimeError.
func ProveRuntime() error {
	return judge(runProbes())
}

// judge turns the probes' answers into ProveRuntime's.
func judge(report probeReport) error {
	e := &RuntimeError{Unproven: report.Unproven}
	var sockets []string // granted in a new user namespace
	answered := map[string]bool{}
	for _, r := range report.Results {
		answered[r.Probe] = true
		errno := syscall.Errno(r.Errno)
		replace := r.Probe == probeReplace4 || r.Probe == probeReplace6
		switch {
		case replace && errno == syscall.EPERM:
		case replace && (errno == 0 || errno == syscall.EINVAL || errno == syscall.ENOENT):
			// EINVAL and ENOENT are the answers to the table's name, which only come past
			// the capability check.
			e.Granted = append(e.Granted, fmt.Sprintf("a process without CAP_NET_ADMIN got %s to %s, not EPERM (no CAP_NET_ADMIN check)", errnoName(errno), r.Probe))
		case replace:
			e.Unproven = append(e.Unproven, fmt.Sprintf("%s without CAP_NET_ADMIN: %s", r.Probe, errnoName(errno)))
		case errno == syscall.EPERM || errno == syscall.EACCES:
		case errno == syscall.EAFNOSUPPORT || errno == syscall.EPROTONOSUPPORT || errno == syscall.ESOCKTNOSUPPORT:
			// The runtime has no such socket for anyone.
		case errno == 0:
			sockets = append(sockets, r.Probe)
		default:
			e.Unproven = append(e.Unproven, fmt.Sprintf("%s in a new user namespace: %s", r.Probe, errnoName(errno)))
		}
	}
	if len(sockets) > 0 {
		e.Granted = append([]string{"a process in a new user namespace got " + strings.Join(sockets, ", ") + " (CAP_NET_RAW in its own user namespace was enough)"}, e.Granted...)
	}
	for _, p := range requiredProbes {
		if !answered[p] && len(report.Unproven) == 0 {
			e.Unproven = append(e.Unproven, p+": no answer")
		}
	}
	if len(e.Granted) == 0 && len(e.Unproven) == 0 {
		return nil
	}
	return e
}

// errnoName is an answer as the runtime's headers name it: "EPERM (operation not permitted)".
func errnoName(errno syscall.Errno) string {
	if errno == 0 {
		return "success"
	}
	for _, n := range []struct {
		errno syscall.Errno
		name  string
	}{{syscall.EPERM, "EPERM"}, {syscall.EACCES, "EACCES"}, {syscall.EINVAL, "EINVAL"}, {syscall.ENOENT, "ENOENT"}, {syscall.ENOPROTOOPT, "ENOPROTOOPT"}} {
		if errno == n.errno {
			return n.name + " (" + errno.Error() + ")"
		}
	}
	return fmt.Sprintf("errno %d (%v)", int(errno), errno)
}
