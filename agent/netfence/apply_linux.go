//go:build amd64 || arm64

package netfence

import (
	"errors"
	"fmt"
	"runtime"
	"syscall"
	"unsafe"
)

// Apply replaces the IPv4 and the IPv6 filter tables of the calling thread's network namespace
// with FilterTable(output) of each family, and returns the families it fenced. IPv6 is left
// out only when the sandbox has no IPv6 at all (no IPv6 raw socket: EAFNOSUPPORT).
func Apply(output []Rule) ([]Fenced, error) {
	var fenced []Fenced
	for _, f := range []family{ipv4, ipv6} {
		refuses, err := f.apply(output, true)
		if f.name == ipv6.name && errors.Is(err, syscall.EAFNOSUPPORT) {
			continue
		}
		if err != nil {
			return nil, err
		}
		fenced = append(fenced, Fenced{Family: f.name, RefusesTCP: refuses})
	}
	return fenced, nil
}

// apply writes f's filter table as iptables-restore does: IPT_SO_GET_INFO for the current
// table (its entry count is how many old counters the kernel hands back), then
// IPT_SO_SET_REPLACE, then IPT_SO_GET_INFO again to check the table in place is the one written.
// With refuse, it writes the table that refuses TCP; a runtime that refuses the REJECT target
// (gVisor before it had one answers EINVAL, a Linux kernel without ipt_REJECT ENOENT) gets the
// table that drops everything instead, which denies the same and answers nothing: refuses says
// which was written.
func (f family) apply(output []Rule, refuse bool) (refuses bool, err error) {
	fd, err := syscall.Socket(f.domain, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
	if err != nil {
		return false, fmt.Errorf("can't initialize %s table `filter': raw socket: %w: %s", f.tool, err, fixCapabilities)
	}
	defer syscall.Close(fd)
	old, err := f.tableInfo(fd)
	if err != nil {
		return false, err
	}
	refuses = refuse
	layout, err := f.replace(fd, output, refuses, old.NumEntries)
	if refuses && (errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOENT)) {
		// A refused replace leaves the old table, and its entry count, in place.
		refuses = false
		layout, err = f.replace(fd, output, refuses, old.NumEntries)
	}
	if errors.Is(err, syscall.EINVAL) {
		return false, fmt.Errorf("can't replace %s table `filter': %w: this runtime refuses the table (older gVisor releases accept no FORWARD policy but ACCEPT); upgrade runsc, or set the chart's jobDefaults.netstackFence.enabled=false", f.tool, err)
	} else if err != nil {
		return false, fmt.Errorf("can't replace %s table `filter': %w: %s", f.tool, err, fixCapabilities)
	}
	now, err := f.tableInfo(fd)
	if err != nil {
		return false, err
	}
	if !now.SameChains(layout) {
		return false, fmt.Errorf("the %s filter table read back (%d entries, %d bytes) is not the one written (%d entries, %d bytes): this runtime's netfilter does not keep the fence; set the chart's jobDefaults.netstackFence.enabled=false", f.name, now.NumEntries, now.Size, layout.NumEntries, layout.Size)
	}
	return refuses, nil
}

// replace writes FilterTable(output, refuse) with IPT_SO_SET_REPLACE, handing the kernel room for
// the numCounters counters of the table it replaces, and returns the layout written.
func (f family) replace(fd int, output []Rule, refuse bool, numCounters uint32) (Layout, error) {
	entries, layout := f.FilterTable(output, refuse)
	req := ReplaceRequest(entries, layout, numCounters)
	counters := make([]byte, countersSize*max(numCounters, 1))
	// The kernel writes the old counters through this pointer during the call: pin them.
	var pinner runtime.Pinner
	pinner.Pin(&counters[0])
	defer pinner.Unpin()
	le.PutUint64(req[replaceCountersPtrAt:], uint64(uintptr(unsafe.Pointer(&counters[0]))))
	return layout, setReplace(f, fd, req)
}

// setReplace is IPT_SO_SET_REPLACE; a test stands in a runtime without the REJECT target.
var setReplace = family.setsockopt

// tableInfo reads the layout of f's filter table (IPT_SO_GET_INFO).
func (f family) tableInfo(fd int) (Layout, error) {
	info := make([]byte, getInfoSize)
	copy(info, "filter")
	if err := f.getsockopt(fd, info); err != nil {
		return Layout{}, fmt.Errorf("can't initialize %s table `filter': %w: %s", f.tool, err, fixCapabilities)
	}
	if hooks := le.Uint32(info[getInfoValidHooksAt:]); hooks != filterValidHooks {
		return Layout{}, fmt.Errorf("the %s filter table has hooks %#x, not INPUT, FORWARD and OUTPUT (%#x): this runtime's netfilter is not one netfence knows; set the chart's jobDefaults.netstackFence.enabled=false", f.name, hooks, filterValidHooks)
	}
	var l Layout
	for hook := range numHooks {
		l.HookEntry[hook] = le.Uint32(info[getInfoHookEntryAt+4*hook:])
		l.Underflow[hook] = le.Uint32(info[getInfoUnderflowAt+4*hook:])
	}
	l.NumEntries = le.Uint32(info[getInfoNumEntriesAt:])
	l.Size = le.Uint32(info[getInfoSizeAt:])
	return l, nil
}

// getsockopt and setsockopt of f's table option (the syscall package has no wrapper for a
// buffer).
func (f family) getsockopt(fd int, buf []byte) error {
	size := uint32(len(buf))
	_, _, errno := syscall.Syscall6(syscall.SYS_GETSOCKOPT, uintptr(fd), uintptr(f.level), uintptr(f.opt), uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&size)), 0)
	return errnoError(errno)
}

func (f family) setsockopt(fd int, buf []byte) error {
	_, _, errno := syscall.Syscall6(syscall.SYS_SETSOCKOPT, uintptr(fd), uintptr(f.level), uintptr(f.opt), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), 0)
	return errnoError(errno)
}

func errnoError(errno syscall.Errno) error {
	if errno != 0 {
		return errno
	}
	return nil
}
