//go:build amd64 || arm64

package netfence

import (
	"fmt"
	"runtime"
	"syscall"
	"unsafe"
)

// The socket options of ip_tables (linux/netfilter_ipv4/ip_tables.h), at level SOL_IP.
const (
	iptSoSetReplace = 64 // IPT_SO_SET_REPLACE
	iptSoGetInfo    = 64 // IPT_SO_GET_INFO
)

// Apply replaces the IPv4 filter table of the calling thread's network namespace with
// FilterTable(output), as iptables-restore does: IPT_SO_GET_INFO for the current table (its
// entry count is how many old counters the kernel hands back), then IPT_SO_SET_REPLACE, then
// IPT_SO_GET_INFO again to check the table in place is the one written.
func Apply(output []Rule) error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
	if err != nil {
		return fmt.Errorf("can't initialize iptables table `filter': raw socket: %w: %s", err, fixCapabilities)
	}
	defer syscall.Close(fd)
	old, err := tableInfo(fd)
	if err != nil {
		return err
	}
	entries, layout := FilterTable(output)
	req := ReplaceRequest(entries, layout, old.NumEntries)
	counters := make([]byte, countersSize*max(old.NumEntries, 1))
	// The kernel writes the old counters through this pointer during the call: pin them.
	var pinner runtime.Pinner
	pinner.Pin(&counters[0])
	defer pinner.Unpin()
	le.PutUint64(req[replaceCountersPtrAt:], uint64(uintptr(unsafe.Pointer(&counters[0]))))
	if err := setsockopt(fd, iptSoSetReplace, req); err != nil {
		return fmt.Errorf("can't replace iptables table `filter': %w: %s", err, fixCapabilities)
	}
	now, err := tableInfo(fd)
	if err != nil {
		return err
	}
	if !now.SameChains(layout) {
		return fmt.Errorf("the filter table read back (%d entries, %d bytes) is not the one written (%d entries, %d bytes): this runtime's netfilter does not keep the fence; set the chart's jobDefaults.netstackFence=false", now.NumEntries, now.Size, layout.NumEntries, layout.Size)
	}
	return nil
}

// tableInfo reads the filter table's layout (IPT_SO_GET_INFO).
func tableInfo(fd int) (Layout, error) {
	info := make([]byte, getInfoSize)
	copy(info, "filter")
	if err := getsockopt(fd, iptSoGetInfo, info); err != nil {
		return Layout{}, fmt.Errorf("can't initialize iptables table `filter': %w: %s", err, fixCapabilities)
	}
	if hooks := le.Uint32(info[getInfoValidHooksAt:]); hooks != filterValidHooks {
		return Layout{}, fmt.Errorf("the filter table has hooks %#x, not INPUT, FORWARD and OUTPUT (%#x): this runtime's netfilter is not one netfence knows; set the chart's jobDefaults.netstackFence=false", hooks, filterValidHooks)
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

// getsockopt and setsockopt at level SOL_IP: the syscall package has no wrapper for a buffer.
func getsockopt(fd, opt int, buf []byte) error {
	size := uint32(len(buf))
	_, _, errno := syscall.Syscall6(syscall.SYS_GETSOCKOPT, uintptr(fd), syscall.SOL_IP, uintptr(opt), uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&size)), 0)
	return errnoError(errno)
}

func setsockopt(fd, opt int, buf []byte) error {
	_, _, errno := syscall.Syscall6(syscall.SYS_SETSOCKOPT, uintptr(fd), syscall.SOL_IP, uintptr(opt), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), 0)
	return errnoError(errno)
}

func errnoError(errno syscall.Errno) error {
	if errno != 0 {
		return errno
	}
	return nil
}
