// Package agent is the small program the executor copies into every job pod at prepare. It runs
// each stage detached from the exec stream that started it, in its own process group, with the
// output in a file and the exit status in another, so that a dropped stream can re-attach and
// resume from the last byte delivered, and a stage's status is never guessed.
//
// It uses only the standard library: it is copied into the pod once per job, so it stays small.
//
// Layout in the pod (BaseDir is 0700, owned by the container user):
//
//	BaseDir/agent                the agent binary
//	BaseDir/bin/                 tools put first on every stage's PATH
//	BaseDir/agent.sock           the job's stage daemon (started by "init" at prepare)
//	BaseDir/stages/<id>/script   the stage script, delivered over exec stdin
//	BaseDir/stages/<id>/out      stdout and stderr of the stage, merged as a job log is
//	BaseDir/stages/<id>/pgid     the stage's process group, written once it runs
//	BaseDir/stages/<id>/sid      the session to sweep for escaped descendants on kill
//	BaseDir/stages/<id>/keeper   the process waiting for the stage, spared on kill (0: none)
//	BaseDir/stages/<id>/status   the exit code, written atomically after the stage ends
package agent

import (
	"fmt"
	"strconv"
	"strings"
)

const (
	// BaseDir is the executor's private directory in the pod.
	BaseDir = "/tmp/.sandbox-executor"
	// BinaryPath is where prepare installs the agent.
	BinaryPath = BaseDir + "/agent"
	// StagesDir holds one directory per stage invocation.
	StagesDir = BaseDir + "/stages"
	// BinDir comes first on every stage's PATH: tools the executor ships into the pod (the
	// runner's helper binary for cache and artifacts) work without rebuilding the job's image.
	BinDir = BaseDir + "/bin"
)

// Control lines travel on the exec stream's stderr, so the job's own output (stdout) is passed
// through byte for byte. A control line starts with an ASCII record separator, which a shell
// script's stderr does not produce by accident.
const controlPrefix = "\x1esandbox-executor:"

// ExitAgentFailure is the agent's own exit code when it cannot start or follow a stage; the
// reason is on stderr. A stage's exit code is reported in a status line, never as the agent's.
const ExitAgentFailure = 125

// StatusLine reports a finished stage's exit code.
func StatusLine(code int) string { return fmt.Sprintf("%sstatus %d\n", controlPrefix, code) }

// StartedLine acknowledges that the stage runs (or ran): from then on, a re-attach must find it.
func StartedLine() string { return controlPrefix + "started\n" }

// HeartbeatLine keeps idle streams alive through proxies and load balancers during silent stages.
func HeartbeatLine() string { return controlPrefix + "heartbeat\n" }

// Control is a parsed control line.
type Control struct {
	Heartbeat bool
	Started   bool
	// Status is the stage's exit code, valid when neither Heartbeat nor Started is set.
	Status int
}

// ParseControl recognises a control line (without its newline). ok is false for ordinary text.
func ParseControl(line string) (c Control, ok bool) {
	rest, found := strings.CutPrefix(line, controlPrefix)
	if !found {
		return Control{}, false
	}
	switch rest {
	case "heartbeat":
		return Control{Heartbeat: true}, true
	case "started":
		return Control{Started: true}, true
	}
	if v, found := strings.CutPrefix(rest, "status "); found {
		code, err := strconv.Atoi(v)
		if err == nil {
			return Control{Status: code}, true
		}
	}
	return Control{}, false
}

// StartArgs is the agent command line for starting (or re-attaching to) a stage. The script
// itself goes over stdin; its size and digest let the agent refuse a truncated delivery instead
// of running half a script.
// With resume, the agent refuses to start the stage afresh: the caller knows it was started, so a
// missing stage means the pod lost it (restarted, or replaced under the same name).
func StartArgs(stageDir string, size int, sha256Hex string, offset int64, resume bool) []string {
	args := []string{BinaryPath, "start", "--dir", stageDir, "--size", strconv.Itoa(size), "--sha256", sha256Hex, "--offset", strconv.FormatInt(offset, 10)}
	if resume {
		args = append(args, "--resume")
	}
	return args
}

// KillArgs is the agent command line that stops a stage's whole process tree.
func KillArgs(stageDir string, graceSeconds int) []string {
	return []string{BinaryPath, "kill", "--dir", stageDir, "--grace", strconv.Itoa(graceSeconds) + "s"}
}

// Probe is the agent's report on the pod, printed as JSON by "probe".
type Probe struct {
	Shell         string `json:"shell"`
	KernelRelease string `json:"kernel_release"`
	KernelVersion string `json:"kernel_version"`
	UID           int    `json:"uid"`
}
