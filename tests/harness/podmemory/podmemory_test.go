package podmemory_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/procfs"

	"github.com/sandbox-executor/sandbox-executor/tests/harness/podmemory"
)

const uid = "0a1b2c3d-0000-4000-8000-00000000abcd"

// fakeNode is a /proc and a memory cgroup hierarchy in a temporary directory.
type fakeNode struct {
	t            *testing.T
	proc, memory string
}

func newFakeNode(t *testing.T) fakeNode {
	dir := t.TempDir()
	n := fakeNode{t, filepath.Join(dir, "proc"), filepath.Join(dir, "memory")}
	n.write(filepath.Join(n.proc, "stat"), "cpu 0 0 0 0\n") // procfs.NewFS checks the mount point only
	return n
}

func (n fakeNode) write(path, text string) {
	n.t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		n.t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		n.t.Fatal(err)
	}
}

// process writes the files of a process: its memory cgroup, parent, argv[0] and PSS. Its comm
// is "exe", as runsc's processes have it.
func (n fakeNode) process(pid, ppid int, argv0, memoryCgroup string, pssKiB int) {
	dir := filepath.Join(n.proc, fmt.Sprint(pid))
	n.write(filepath.Join(dir, "cgroup"), "9:name=systemd:/\n4:memory:"+memoryCgroup+"\n1:cpu:/\n")
	n.write(filepath.Join(dir, "comm"), "exe\n")
	n.write(filepath.Join(dir, "cmdline"), argv0+"\x00--flag\x00")
	n.write(filepath.Join(dir, "stat"), fmt.Sprintf("%d (exe) S %d%s\n", pid, ppid, strings.Repeat(" 0", 49)))
	n.write(filepath.Join(dir, "smaps_rollup"), fmt.Sprintf(
		"55d0c0000000-7ffd00000000 ---p 00000000 00:00 0 [rollup]\nRss: %d kB\nPss: %d kB\nPss_Anon: 1 kB\n", 2*pssKiB, pssKiB))
}

func (n fakeNode) measure(uid string) (podmemory.Usage, error) {
	n.t.Helper()
	proc, err := procfs.NewFS(n.proc)
	if err != nil {
		n.t.Fatal(err)
	}
	return podmemory.Node{Proc: proc, MemoryCgroup: n.memory}.Pod(uid)
}

func TestPodSumsItsCgroupsProcessesAndTheirShim(t *testing.T) {
	for _, tc := range []struct{ driver, podCgroup string }{
		{"cgroupfs", "/kubepods/burstable/pod" + uid},
		{"systemd", "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice"},
	} {
		t.Run(tc.driver, func(t *testing.T) {
			n := newFakeNode(t)
			n.process(1, 0, "/sbin/init", "/", 100)
			// The pod's sandbox container: its shim, the sentry and a systrap stub, a gofer, and
			// the shim's runsc wait.
			n.process(500, 1, "/opt/bin/containerd-shim-runsc-v1", "/system/containerd", 7000)
			n.process(501, 500, "runsc-gofer", tc.podCgroup+"/abc", 3000)
			n.process(502, 500, "runsc-sandbox", tc.podCgroup+"/abc", 30000)
			n.process(503, 502, "runsc-sandbox", tc.podCgroup+"/abc", 700)
			n.process(504, 500, "/opt/bin/runsc", "/system/containerd", 2000)
			// Its job container: a shim of its own, its gofer (in the pod's cgroup) and runsc wait.
			n.process(510, 1, "/opt/bin/containerd-shim-runsc-v1", "/system/containerd", 6000)
			n.process(511, 510, "runsc-gofer", tc.podCgroup, 2500)
			n.process(512, 510, "/opt/bin/runsc", "/system/containerd", 1500)
			// Another pod's.
			n.process(600, 1, "/opt/bin/containerd-shim-runsc-v1", "/system/containerd", 9000)
			n.process(601, 600, "runsc-sandbox", "/kubepods/besteffort/pod1111/def", 40000)
			n.process(602, 600, "/opt/bin/runsc", "/system/containerd", 1000)
			n.write(filepath.Join(n.memory, tc.podCgroup, "memory.usage_in_bytes"), "52428800\n")
			n.write(filepath.Join(n.memory, tc.podCgroup, "memory.stat"), "cache 8388608\ninactive_file 1048576\ntotal_cache 8388608\ntotal_inactive_file 4194304\n")

			u, err := n.measure(uid)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range u.Processes {
				got = append(got, fmt.Sprintf("%d<%d %s %d %v", p.PID, p.PPID, p.Name, p.PSS/1024, p.OutsideCgroup))
			}
			want := "500<1 containerd-shim-runsc-v1 7000 true, 501<500 runsc-gofer 3000 false, 502<500 runsc-sandbox 30000 false, " +
				"503<502 runsc-sandbox 700 false, 504<500 runsc 2000 true, 510<1 containerd-shim-runsc-v1 6000 true, " +
				"511<510 runsc-gofer 2500 false, 512<510 runsc 1500 true"
			if strings.Join(got, ", ") != want {
				t.Errorf("processes: %s\nwant %s", strings.Join(got, ", "), want)
			}
			if u.PSS != 52700*1024 || u.OutsideCgroupPSS() != 16500*1024 {
				t.Errorf("PSS %d, outside the cgroup %d; want %d and %d", u.PSS, u.OutsideCgroupPSS(), 52700*1024, 16500*1024)
			}
			if u.Cgroup != tc.podCgroup || u.WorkingSet != 52428800-4194304 {
				t.Errorf("cgroup %s, working set %d; want %s, %d", u.Cgroup, u.WorkingSet, tc.podCgroup, 52428800-4194304)
			}
		})
	}
}

func TestPodRefusesAProcessWhoseParentIsNoShim(t *testing.T) {
	n := newFakeNode(t)
	n.process(1, 0, "/sbin/init", "/", 100)
	n.process(700, 1, "runsc-sandbox", "/kubepods/burstable/pod"+uid+"/abc", 30000)
	if _, err := n.measure(uid); err == nil || !strings.Contains(err.Error(), `parent 1 is "init", not a containerd shim`) {
		t.Errorf("got %v", err)
	}
}

func TestPodWithoutProcessesIsAnError(t *testing.T) {
	n := newFakeNode(t)
	n.process(1, 0, "/sbin/init", "/", 100)
	if _, err := n.measure(uid); err == nil || !strings.Contains(err.Error(), "no process on this node is in its cgroup") {
		t.Errorf("got %v", err)
	}
}
