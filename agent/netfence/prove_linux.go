//go:build amd64 || arm64

package netfence

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// probeTimeout bounds each probe child: it answers at once, but it starts under the init
// container's CPU limit.
const probeTimeout = 30 * time.Second

// The capabilities the probes hold or drop (linux/capability.h).
const (
	capNetAdmin = 12
	capNetRaw   = 13
)

// runtimeProbes runs the probe children: the sockets of a new user namespace, then the replace
// without CAP_NET_ADMIN.
func runtimeProbes() probeReport {
	var report probeReport
	sockets, err := probeChild(roleUserns, &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER, AmbientCaps: []uintptr{capNetRaw}})
	if err != nil {
		// No ambient capabilities (gVisor before release-20260615.0 answers PR_CAP_AMBIENT
		// with EINVAL): one thread unshares a user namespace of its own instead.
		var errUnshare error
		if sockets, errUnshare = probeChild(roleUnshare, nil); errUnshare != nil {
			report.Unproven = append(report.Unproven, fmt.Sprintf("raw and packet sockets in a new user namespace: a child in one holding CAP_NET_RAW: %v; a thread unsharing one: %v", err, errUnshare))
		}
	}
	report.Results = append(report.Results, sockets...)
	replaces, err := probeChild(roleNoAdmin, nil)
	if err != nil {
		report.Unproven = append(report.Unproven, fmt.Sprintf("%s without CAP_NET_ADMIN: %v", probeReplace4, err))
	}
	report.Results = append(report.Results, replaces...)
	return report
}

// probeChild runs this binary as the netfence verb with ProbeRoleEnv=role and attr, and returns
// the probes' answers it prints, or why it printed none.
func probeChild(role string, attr *syscall.SysProcAttr) ([]probeResult, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, self, "netfence")
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(e string) bool { return strings.HasPrefix(e, ProbeRoleEnv+"=") }), ProbeRoleEnv+"="+role)
	cmd.SysProcAttr = attr
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// A child that probed prints its answers and still fails (errProbeChild): its exit says
	// nothing, its answers do.
	err = cmd.Run()
	var results []probeResult
	if stdout.Len() > 0 && json.Unmarshal(stdout.Bytes(), &results) == nil {
		return results, nil
	}
	if said := strings.TrimPrefix(strings.TrimSpace(stderr.String()), "sandbox-executor-agent netfence: "); said != "" {
		return nil, errors.New(strings.Join(strings.Fields(said), " "))
	}
	if err == nil {
		err = fmt.Errorf("no answer: %q", stdout.String())
	}
	return nil, err
}

// errProbeChild ends every probe child that probed, after its answers: a netfence container
// given ProbeRoleEnv by mistake, or by whoever could change its environment and not its command,
// fails as it would without the table, instead of succeeding without writing it.
var errProbeChild = errors.New("printed the runtime probe's answers and wrote no table: " + ProbeRoleEnv + " makes netfence a probe of its parent's, never the verb")

// runProbeRole is a probe child: it runs role's probes, prints their answers as JSON and fails
// (errProbeChild), or fails saying why it could not probe. The probes change this thread's
// credentials, so it stays locked to it; the process ends after.
func runProbeRole(role string, stdout io.Writer) error {
	runtime.LockOSThread()
	var results []probeResult
	var err error
	switch role {
	case roleUserns:
		results, err = userNamespaceSockets(false)
	case roleUnshare:
		results, err = userNamespaceSockets(true)
	case roleNoAdmin:
		results, err = replaceProbes(true)
	default:
		err = fmt.Errorf("%s=%q names no probe", ProbeRoleEnv, role)
	}
	if err != nil {
		return err
	}
	if err := json.NewEncoder(stdout).Encode(results); err != nil {
		return err
	}
	return errProbeChild
}

// userNamespaceSockets asks for raw and packet sockets from this thread, in a new user
// namespace where it holds CAP_NET_RAW: the one it was started in, or with unshare one of its
// own. It fails unless the thread is in a user namespace that maps no IDs (a new one: the
// initial namespace maps them all) and holds CAP_NET_RAW there, so that a refusal proves the
// runtime asks more than that.
func userNamespaceSockets(unshare bool) ([]probeResult, error) {
	if unshare {
		if _, _, errno := syscall.RawSyscall(syscall.SYS_UNSHARE, syscall.CLONE_NEWUSER, 0, 0); errno != 0 {
			return nil, fmt.Errorf("unshare(CLONE_NEWUSER) on one thread: %v", errno)
		}
	}
	uidMap, err := os.ReadFile("/proc/thread-self/uid_map")
	if err != nil {
		return nil, err
	}
	if len(bytes.TrimSpace(uidMap)) != 0 {
		return nil, fmt.Errorf("not in a new user namespace: its uid_map maps %q", strings.Join(strings.Fields(string(uidMap)), " "))
	}
	if held, err := effectiveCapability(capNetRaw); err != nil {
		return nil, fmt.Errorf("capget: %w", err)
	} else if !held {
		return nil, errors.New("no CAP_NET_RAW in the new user namespace")
	}
	return socketProbes(), nil
}

// socketProbes asks for each raw and packet socket and closes any it gets.
func socketProbes() []probeResult {
	const ethPAll = 0x0300 // htons(ETH_P_ALL)
	var results []probeResult
	for _, s := range []struct {
		probe                 string
		domain, typ, protocol int
	}{
		{probePacketRaw, syscall.AF_PACKET, syscall.SOCK_RAW, ethPAll},
		{probePacketDgram, syscall.AF_PACKET, syscall.SOCK_DGRAM, ethPAll},
		{probeInetRaw, syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW},
		{probeInet6Raw, syscall.AF_INET6, syscall.SOCK_RAW, syscall.IPPROTO_RAW},
	} {
		fd, err := syscall.Socket(s.domain, s.typ|syscall.SOCK_CLOEXEC, s.protocol)
		if err == nil {
			syscall.Close(fd)
		}
		results = append(results, probeResult{Probe: s.probe, Errno: errnoOf(err)})
	}
	return results
}

// replaceProbes opens a raw socket of each family, as Apply does, drops CAP_NET_ADMIN from this
// thread (dropAdmin: a test keeps it, to see the answer of a runtime that checks nothing), and
// asks each to replace the table named probeTableName. A family without raw sockets (IPv6 in a
// sandbox without it) has no table to replace and is not asked; IPv4 must be.
func replaceProbes(dropAdmin bool) ([]probeResult, error) {
	type opened struct {
		f  family
		fd int
	}
	var sockets []opened
	defer func() {
		for _, s := range sockets {
			syscall.Close(s.fd)
		}
	}()
	for _, f := range []family{ipv4, ipv6} {
		fd, err := syscall.Socket(f.domain, syscall.SOCK_RAW|syscall.SOCK_CLOEXEC, syscall.IPPROTO_RAW)
		if f.name == ipv6.name && errors.Is(err, syscall.EAFNOSUPPORT) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s raw socket: %w: %s", f.name, err, fixCapabilities)
		}
		sockets = append(sockets, opened{f, fd})
	}
	if dropAdmin {
		if err := dropCapability(capNetAdmin); err != nil {
			return nil, fmt.Errorf("dropping CAP_NET_ADMIN: %w", err)
		}
		if held, err := effectiveCapability(capNetAdmin); err != nil {
			return nil, fmt.Errorf("capget: %w", err)
		} else if held {
			return nil, errors.New("CAP_NET_ADMIN still held after dropping it")
		}
	}
	req := make([]byte, replaceSize)
	copy(req, probeTableName)
	var results []probeResult
	for _, s := range sockets {
		probe := probeReplace4
		if s.f.name == ipv6.name {
			probe = probeReplace6
		}
		results = append(results, probeResult{Probe: probe, Errno: errnoOf(s.f.setsockopt(s.fd, req))})
	}
	return results, nil
}

func errnoOf(err error) int {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return int(errno)
	}
	if err != nil {
		return int(syscall.EIO)
	}
	return 0
}

// capget and capset (linux/capability.h, version 3): the calling thread's capabilities.
type capHeader struct {
	version uint32
	pid     int32
}

type capData struct {
	effective, permitted, inheritable uint32
}

const linuxCapabilityVersion3 = 0x20080522

func capabilities() (capHeader, [2]capData, error) {
	hdr := capHeader{version: linuxCapabilityVersion3}
	var data [2]capData
	if _, _, errno := syscall.RawSyscall(syscall.SYS_CAPGET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); errno != 0 {
		return hdr, data, errno
	}
	return hdr, data, nil
}

func effectiveCapability(c uint) (bool, error) {
	_, data, err := capabilities()
	return data[c/32].effective&(1<<(c%32)) != 0, err
}

// dropCapability drops c from the calling thread's effective, permitted and inheritable sets,
// which needs no privilege; the thread cannot take it back.
func dropCapability(c uint) error {
	hdr, data, err := capabilities()
	if err != nil {
		return err
	}
	bit := uint32(1) << (c % 32)
	data[c/32].effective &^= bit
	data[c/32].permitted &^= bit
	data[c/32].inheritable &^= bit
	if _, _, errno := syscall.RawSyscall(syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); errno != 0 {
		return errno
	}
	return nil
}
