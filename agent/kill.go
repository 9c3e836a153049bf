package agent

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

func (a *Agent) killCommand(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("kill", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dir := fs.String("dir", "", "stage directory")
	grace := fs.Duration("grace", 5*time.Second, "time between SIGTERM and SIGKILL")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := a.checkStageDir(*dir); err != nil {
		return err
	}
	pgid, err := readInt(filepath.Join(*dir, "pgid"))
	if errors.Is(err, os.ErrNotExist) {
		return nil // never started: nothing to stop
	}
	if err != nil {
		return err
	}
	sid, err := readInt(filepath.Join(*dir, "sid"))
	if err != nil {
		return err
	}
	keeper, err := readInt(filepath.Join(*dir, "keeper"))
	if err != nil {
		return err
	}
	stage := stageProcesses{pgid: pgid, sid: sid, keeper: keeper}
	if stage.signal(syscall.SIGTERM) > 0 && !stage.waitGone(*grace) {
		stage.signal(syscall.SIGKILL)
		if !stage.waitGone(5 * time.Second) {
			return fmt.Errorf("processes of the stage survive SIGKILL: %v", stage.pids())
		}
	}
	// Let the supervisor record how the stage ended, so a re-attach reports it.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if _, done := readStatus(*dir); done {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Fprintln(stdout, "stage stopped")
	return nil
}

// stageProcesses finds a stage's processes: its process group, and anything else in its session
// (descendants that moved to a process group of their own). The keeper that waits for the stage
// (a supervisor sharing the session) is spared so that it records the exit status.
type stageProcesses struct{ pgid, sid, keeper int }

func (s stageProcesses) pids() []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == s.keeper || pid == os.Getpid() {
			continue
		}
		pgrp, session, ok := procGroups(pid)
		if ok && (pgrp == s.pgid || session == s.sid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func (s stageProcesses) signal(sig syscall.Signal) int {
	pids := s.pids()
	_ = syscall.Kill(-s.pgid, sig)
	for _, pid := range pids {
		_ = syscall.Kill(pid, sig)
	}
	return len(pids)
}

func (s stageProcesses) waitGone(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		if len(s.pids()) == 0 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// procGroups reads the process group and session of pid from /proc/<pid>/stat. The command name
// (field 2) may contain spaces and parentheses, so fields are counted after its last ')'.
// Zombies are skipped: they hold no resources and cannot be signalled away.
func procGroups(pid int) (pgrp, session int, ok bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, false
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, 0, false
	}
	fields := bytes.Fields(data[i+1:])
	// fields: state ppid pgrp session ...
	if len(fields) < 4 || string(fields[0]) == "Z" {
		return 0, 0, false
	}
	pgrp, err1 := strconv.Atoi(string(fields[2]))
	session, err2 := strconv.Atoi(string(fields[3]))
	return pgrp, session, err1 == nil && err2 == nil
}

func readInt(path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(string(bytes.TrimSpace(data)))
}
