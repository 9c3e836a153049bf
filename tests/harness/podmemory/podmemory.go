// Package podmemory measures from the node what a pod's memory costs the host: the proportional
// set size (PSS) of the host processes that run it and the pod cgroup's working set as the
// kubelet computes it. Under gVisor (containerd-shim-runsc-v1, systrap) a pod's host processes
// are runsc's sandbox (the sentry and its stub processes) and one gofer per container, in the
// pod's cgroup; and, in containerd's cgroup, one containerd shim per container, the parent of
// that container's processes, with a `runsc wait` child each. It reads the node's /proc and
// cgroup v1 memory hierarchy, so it runs as root on the node itself (the local cluster's single
// node is the test host).
package podmemory

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/procfs"
)

// Node is a node's /proc and its cgroup v1 memory hierarchy.
type Node struct {
	Proc         procfs.FS
	MemoryCgroup string
}

// Local is the node this process runs on.
func Local() (Node, error) {
	proc, err := procfs.NewDefaultFS()
	return Node{Proc: proc, MemoryCgroup: "/sys/fs/cgroup/memory"}, err
}

// Process is one host process of a pod.
type Process struct {
	PID, PPID int
	// Name is the base name of its argv[0] (runsc-sandbox, runsc-gofer,
	// containerd-shim-runsc-v1, runsc), or its command name (comm) without one: "exe" for the
	// sentry's systrap stub processes.
	Name string
	// PSS is its proportional set size in bytes: its private pages, and its share of each page
	// it shares with other processes.
	PSS uint64
	// OutsideCgroup: not in the pod's cgroup, a shim of the pod's containers or another child
	// of one.
	OutsideCgroup bool
}

// Usage is one pod's memory on the host.
type Usage struct {
	// Processes are the pod's host processes, by PID.
	Processes []Process
	// PSS is theirs summed: what the host spends on the pod, each page shared among them
	// counted once.
	PSS uint64
	// Cgroup is the pod's cgroup, under the memory hierarchy.
	Cgroup string
	// WorkingSet is the pod cgroup's memory.usage_in_bytes less its total_inactive_file, the
	// kubelet's working set: it leaves out the processes outside the cgroup and counts the page
	// cache and kernel memory charged to the pod.
	WorkingSet uint64
}

// OutsideCgroupPSS is the share of PSS of the processes outside the pod's cgroup.
func (u Usage) OutsideCgroupPSS() uint64 {
	var sum uint64
	for _, p := range u.Processes {
		if p.OutsideCgroup {
			sum += p.PSS
		}
	}
	return sum
}

// Pod measures the pod with this UID: the processes in its cgroup, the containerd shims whose
// children they are, and the shims' other descendants. A process in the pod's cgroup whose
// parent is neither in it nor a containerd shim fails it: then the pod is not laid out as this
// package assumes.
func (n Node) Pod(uid string) (Usage, error) {
	all, err := n.Proc.AllProcs()
	if err != nil {
		return Usage{}, err
	}
	var u Usage
	parent := map[int]int{}
	inCgroup := map[int]bool{}
	for _, p := range all {
		stat, err := p.Stat()
		if errors.Is(err, fs.ErrNotExist) {
			continue // it ended since the listing
		} else if err != nil {
			return Usage{}, err
		}
		parent[p.PID] = stat.PPID
		cgroups, err := p.Cgroups()
		if errors.Is(err, fs.ErrNotExist) {
			continue
		} else if err != nil {
			return Usage{}, err
		}
		if path, ok := podCgroup(cgroups, uid); ok {
			if u.Cgroup != "" && u.Cgroup != path {
				return Usage{}, fmt.Errorf("pod %s: processes in two pod cgroups, %s and %s", uid, u.Cgroup, path)
			}
			u.Cgroup = path
			inCgroup[p.PID] = true
		}
	}
	if len(inCgroup) == 0 {
		return Usage{}, fmt.Errorf("pod %s: no process on this node is in its cgroup", uid)
	}
	shims := map[int]bool{}
	for pid := range inCgroup {
		ppid := parent[pid]
		if inCgroup[ppid] || shims[ppid] {
			continue
		}
		name, err := n.name(ppid)
		if err != nil {
			return Usage{}, err
		}
		if !strings.HasPrefix(name, "containerd-shim") {
			return Usage{}, fmt.Errorf("pod %s: process %d's parent %d is %q, not a containerd shim", uid, pid, ppid, name)
		}
		shims[ppid] = true
	}
	counted := func(pid int) bool {
		for ; pid > 1; pid = parent[pid] {
			if inCgroup[pid] || shims[pid] {
				return true
			}
		}
		return false
	}
	for pid := range parent {
		if !counted(pid) {
			continue
		}
		p, err := n.process(pid, parent[pid], !inCgroup[pid])
		if errors.Is(err, fs.ErrNotExist) {
			continue
		} else if err != nil {
			return Usage{}, err
		}
		u.Processes = append(u.Processes, p)
		u.PSS += p.PSS
	}
	slices.SortFunc(u.Processes, func(a, b Process) int { return a.PID - b.PID })
	u.WorkingSet, err = workingSet(filepath.Join(n.MemoryCgroup, u.Cgroup))
	return u, err
}

func (n Node) process(pid, ppid int, outside bool) (Process, error) {
	name, err := n.name(pid)
	if err != nil {
		return Process{}, err
	}
	p, err := n.Proc.Proc(pid)
	if err != nil {
		return Process{}, err
	}
	rollup, err := p.ProcSMapsRollup()
	if err != nil {
		return Process{}, fmt.Errorf("process %d (%s): %w", pid, name, err)
	}
	return Process{PID: pid, PPID: ppid, Name: name, PSS: rollup.Pss, OutsideCgroup: outside}, nil
}

// name is the process's Name: runsc re-executes itself through /proc/self/exe, so its sandbox
// and gofer are all "exe" by their comm; their argv[0] tells them apart.
func (n Node) name(pid int) (string, error) {
	p, err := n.Proc.Proc(pid)
	if err != nil {
		return "", err
	}
	args, err := p.CmdLine()
	if err != nil {
		return "", err
	}
	if len(args) > 0 && args[0] != "" {
		return filepath.Base(args[0]), nil
	}
	return p.Comm()
}

// podCgroup is the pod's cgroup in the memory hierarchy if cgroups (one process's) are below it:
// the path up to its pod<UID> part, the UID with dashes (the kubelet's cgroupfs driver) or
// underscores (its systemd driver).
func podCgroup(cgroups []procfs.Cgroup, uid string) (string, bool) {
	names := []string{"pod" + uid, "pod" + strings.ReplaceAll(uid, "-", "_")}
	for _, c := range cgroups {
		if !slices.Contains(c.Controllers, "memory") {
			continue
		}
		parts := strings.Split(c.Path, "/")
		for i, part := range parts {
			if strings.Contains(part, names[0]) || strings.Contains(part, names[1]) {
				return strings.Join(parts[:i+1], "/"), true
			}
		}
	}
	return "", false
}

// workingSet is the cgroup's memory.usage_in_bytes less total_inactive_file from memory.stat
// (none if that is more), as the kubelet computes a pod's working set on cgroup v1.
func workingSet(dir string) (uint64, error) {
	usage, err := os.ReadFile(filepath.Join(dir, "memory.usage_in_bytes"))
	if err != nil {
		return 0, err
	}
	total, err := strconv.ParseUint(strings.TrimSpace(string(usage)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s/memory.usage_in_bytes: %w", dir, err)
	}
	stat, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return 0, err
	}
	inactive, err := statValue(stat, "total_inactive_file")
	if err != nil {
		return 0, fmt.Errorf("%s/memory.stat: %w", dir, err)
	}
	if inactive > total {
		return 0, nil
	}
	return total - inactive, nil
}

// statValue is key's value in a cgroup v1 memory.stat ("key value" lines).
func statValue(stat []byte, key string) (uint64, error) {
	lines := bufio.NewScanner(bytes.NewReader(stat))
	for lines.Scan() {
		if k, v, ok := strings.Cut(lines.Text(), " "); ok && k == key {
			return strconv.ParseUint(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s", key)
}
