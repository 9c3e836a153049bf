// Package wire is the protocol between the executor and the stage agent in the pod: where the
// agent lives, its command lines, the control lines on its stderr, and the framing of the
// network path. Both sides import it; it uses only the standard library, as the agent must.
//
// Layout in the pod (BaseDir is 0700, owned by the container user):
//
//	BaseDir/agent                the agent binary
//	BaseDir/bin/                 tools put first on every stage's PATH
//	BaseDir/agent.sock           the job's stage daemon (started by "serve" or "init")
//	BaseDir/client-ca.pem        the agent CA's certificate(s) the network path trusts
//	BaseDir/identity             the daemon's network identity (IdentityOf), public
//	BaseDir/stages/<id>/script   the stage script, delivered over exec stdin
//	BaseDir/stages/<id>/out      stdout and stderr of the stage, merged as a job log is
//	BaseDir/stages/<id>/pgid     the stage's process group, written once it runs
//	BaseDir/stages/<id>/sid      the session to sweep for escaped descendants on kill
//	BaseDir/stages/<id>/keeper   the process waiting for the stage, spared on kill (0: none)
//	BaseDir/stages/<id>/status   the exit code, written atomically after the stage ends
package wire

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
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
	// BakedDir is where the chart's SandboxTemplates mount what their init container copied
	// from the agent image (read-only in the job container): the agent and the runner's helper.
	BakedDir = "/opt/sandbox-executor"
	// BakedHelperPath is the runner's helper binary there, if the agent image carries it.
	BakedHelperPath = BakedDir + "/gitlab-runner-helper"
	// HelperDigestSuffix names the file beside a baked helper (BakedHelperPath +
	// HelperDigestSuffix) where the init container writes the helper's sha256 as it copies it:
	// 64 lowercase hex digits and a newline. The helper command reads it instead of hashing the
	// helper in the pod.
	HelperDigestSuffix = ".sha256"
)

// Answers of the agent's helper command (HelperArgs), one line: the word, then the baked
// helper's sha256 when there is one.
const (
	HelperBaked    = "baked"
	HelperMismatch = "mismatch"
	HelperAbsent   = "absent"
)

// HelperArgs asks the agent whether the helper baked at BakedHelperPath has the sha256 want and,
// if so, to link it as link (on the stages' PATH, in BinDir).
func HelperArgs(want, link string) []string {
	return []string{BinaryPath, "helper", "--baked", BakedHelperPath, "--sha256", want, "--link", link}
}

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
	// Identity is the agent's network identity (IdentityOf) when it serves the network path.
	Identity string `json:"identity,omitempty"`
	// Fence is a fresh check of the pod's egress fence, when asked for (ProbeArgs): prepare gets
	// it in the probe's round trip instead of one of its own. An agent older than the field
	// leaves it out, and prepare asks with FenceArgs.
	Fence *FenceReport `json:"fence,omitempty"`
}

// ProbeArgs is the agent command line prepare probes a pod with: the probe and a fresh check of
// the pod's egress fence, in one answer.
func ProbeArgs() []string { return []string{BinaryPath, "probe", "--fence"} }

// HeartbeatEvery is how often a silent stage's stream carries a heartbeat: it keeps proxies from
// closing an idle stream, and it lets the runner side tell a silent stage from a dead pod.
const HeartbeatEvery = 5 * time.Second

// PodAgentPath is where templates that bake the agent in mount it (read-only) in the job
// container; a job container whose command starts with it runs "serve".
const PodAgentPath = "/opt/sandbox-executor/agent"

// The stage daemon can also serve agent commands over the pod network, so that a runner in the
// cluster runs a stage with one TCP connection instead of an exec through the API server and the
// kubelet. The connection is TLS 1.3, mutually authenticated: the agent presents a key it made
// when the pod started (its identity, which the executor pins: it reads it from the pod's log,
// over the API server, or from the install exec), and the executor presents a client certificate
// for one job, signed by the installation's agent CA, whose certificate the pod trusts through
// its SandboxTemplate (ClientCAEnv) and whose key never enters a pod. A connection carries one
// command: a header line "SBX2 <base64 JSON args> <stdin length>", then the stdin bytes; the
// answer is frames (stdout, stderr, exit). Plain framing over TLS rather than HTTP keeps
// net/http, and megabytes, out of the agent copied into every pod.

// NetworkPort is where the daemon listens in the pod when it serves the network path.
const NetworkPort = 7543

// ClientCAEnv names the job container's environment variable that holds the agent CA's
// certificate(s), PEM: the executors whose client certificates the agent accepts. Templates set
// it from a ConfigMap; without it the agent serves no network path and stages go over exec.
const ClientCAEnv = "SANDBOX_EXECUTOR_AGENT_CLIENT_CA"

// JobURIPrefix starts the URI SAN of an executor's client certificate; the rest is the job's
// binding (a keyed hash of its token, as on its claim). The agent serves the first job that
// reaches it and refuses every other: a pod belongs to one job.
const JobURIPrefix = "urn:sandbox-executor:job:"

// The agent's first line on the container's stdout, which the kubelet keeps as the pod's log:
// either its identity (the SHA-256 of its public key) or why it serves no network path.
const (
	identityLinePrefix = "sandbox-executor-agent: identity "
	networkOffPrefix   = "sandbox-executor-agent: network path off: "
)

// IdentityLine is the agent's first log line when it serves the network path.
func IdentityLine(identity string) string { return identityLinePrefix + identity + "\n" }

// NetworkOffLine is the agent's first log line when it serves no network path.
func NetworkOffLine(reason string) string { return networkOffPrefix + reason + "\n" }

// ParseFirstLogLine reads the agent's first log line: its identity, or off with the reason it
// serves no network path. ok is false for any other line: not our agent, or not yet started.
func ParseFirstLogLine(line string) (identity string, offReason string, ok bool) {
	line = strings.TrimRight(line, "\r\n")
	if v, found := strings.CutPrefix(line, identityLinePrefix); found && ValidIdentity(v) {
		return v, "", true
	}
	if v, found := strings.CutPrefix(line, networkOffPrefix); found {
		return "", v, true
	}
	return "", "", false
}

// IdentityOf is how an agent's key is named: "sha256:" and the hex SHA-256 of its
// SubjectPublicKeyInfo (DER).
func IdentityOf(spki []byte) string {
	sum := sha256.Sum256(spki)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ValidIdentity reports whether s is an identity as IdentityOf makes them.
func ValidIdentity(s string) bool {
	v, found := strings.CutPrefix(s, "sha256:")
	if !found || len(v) != 2*sha256.Size {
		return false
	}
	_, err := hex.DecodeString(v)
	return err == nil
}

// ExitRefused is the exit code of a network request the agent refused (another job's, or bad
// arguments).
const ExitRefused = 126

// Frame types on the wire: a byte, a big-endian uint32 length, the payload.
const (
	FrameStdout byte = 1
	FrameStderr byte = 2
	FrameExit   byte = 3
)

// RequestHeader is the first line of a network request.
func RequestHeader(args []string, stdinLen int) string {
	encoded, _ := json.Marshal(args)
	return fmt.Sprintf("SBX2 %s %d\n", base64.StdEncoding.EncodeToString(encoded), stdinLen)
}

// Request is a parsed request header.
type Request struct {
	Args     []string
	StdinLen int
}

// ParseRequestHeader reads a header line made by RequestHeader; the error is what the agent
// answers a malformed one with.
func ParseRequestHeader(line string) (Request, error) {
	fields := strings.Fields(line)
	if len(fields) != 3 || fields[0] != "SBX2" {
		return Request{}, errors.New("not a sandbox-executor request (SBX2)")
	}
	var req Request
	encoded, err := base64.StdEncoding.DecodeString(fields[1])
	if err != nil || json.Unmarshal(encoded, &req.Args) != nil || len(req.Args) == 0 {
		return Request{}, errors.New("bad arguments")
	}
	req.StdinLen, err = strconv.Atoi(fields[2])
	if err != nil || req.StdinLen < 0 {
		return Request{}, errors.New("bad stdin length")
	}
	return req, nil
}

// MaxFrame bounds one frame's payload. A peer names the length before the bytes, so without a
// bound a reader would allocate whatever it claims (up to 4 GiB from 5 bytes). The agent's
// largest write is its 256 KiB copy buffer; a frame over MaxFrame is a protocol error.
const MaxFrame = 1 << 20

// ErrFrameTooLarge: the peer claimed a frame over MaxFrame.
var ErrFrameTooLarge = fmt.Errorf("a frame over %d bytes: not a sandbox-executor agent, or a broken one", MaxFrame)

// WriteFrame writes p as frames of at most MaxFrame bytes each (an exit frame is one frame);
// callers that share w serialise their calls.
func WriteFrame(w io.Writer, kind byte, p []byte) error { return WriteFrames(w, kind, p, MaxFrame) }

// WriteFrames writes p as frames of at most limit bytes each: the same framing for a protocol
// with its own limit (the stage server's, whose request is one frame).
func WriteFrames(w io.Writer, kind byte, p []byte, limit int) error {
	for {
		chunk := p[:min(len(p), limit)]
		buf := make([]byte, 5+len(chunk))
		buf[0] = kind
		binary.BigEndian.PutUint32(buf[1:5], uint32(len(chunk)))
		copy(buf[5:], chunk)
		if _, err := w.Write(buf); err != nil {
			return err
		}
		p = p[len(chunk):]
		if len(p) == 0 {
			return nil
		}
	}
}

// ReadFrames demultiplexes a response body onto stdout and stderr and returns the command's exit
// code; io.ErrUnexpectedEOF when the stream ended before the exit frame, ErrFrameTooLarge for a
// frame over MaxFrame, and an error for an exit frame that is not a number.
func ReadFrames(r io.Reader, stdout, stderr io.Writer) (int, error) {
	var hdr [5]byte
	buf := make([]byte, 64<<10)
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
		n := int(binary.BigEndian.Uint32(hdr[1:]))
		if n > MaxFrame {
			return 0, ErrFrameTooLarge
		}
		if n > len(buf) {
			buf = make([]byte, n)
		}
		if _, err := io.ReadFull(r, buf[:n]); err != nil {
			return 0, io.ErrUnexpectedEOF
		}
		switch hdr[0] {
		case FrameStdout:
			if _, err := stdout.Write(buf[:n]); err != nil {
				return 0, err
			}
		case FrameStderr:
			if _, err := stderr.Write(buf[:n]); err != nil {
				return 0, err
			}
		case FrameExit:
			code, err := strconv.Atoi(string(buf[:n]))
			if err != nil {
				return 0, errors.New("an exit frame that is not a number: not a sandbox-executor agent, or a broken one")
			}
			return code, nil
		}
		// A frame of another type is skipped: a newer agent may send more than this reader knows.
	}
}

// The egress fence check. A job pod must not be handed to a job while its NetworkPolicy is not
// enforced (a policy controller restarting, a node whose rules are not programmed yet). The
// agent checks the fence with TCP connects: every denied address (a canary the policy must block)
// must not connect, every allowed one (the GitLab instance) must. The addresses come from the job
// container's environment, set in the SandboxTemplate: addresses only, nothing secret. A baked-in
// agent answers the kubelet's readiness probe on FencePort with a fresh check, so a warm pod is
// not Ready while its fence is down; prepare asks the agent for one more ("fence") before any
// script runs.
const (
	// FenceDenyEnv lists denied host:port canaries, comma-separated. Each must accept TCP
	// connections when not fenced (a timeout or a refusal counts as denied).
	FenceDenyEnv = "SANDBOX_EXECUTOR_FENCE_DENY"
	// FenceAllowEnv lists allowed host:port addresses that must accept, comma-separated: they
	// prove the pod has a network at all, so that a denied canary's silence means something.
	FenceAllowEnv = "SANDBOX_EXECUTOR_FENCE_ALLOW"
	// FenceTimeoutEnv is how long one connect may take (a Go duration, default FenceTimeout).
	FenceTimeoutEnv = "SANDBOX_EXECUTOR_FENCE_TIMEOUT"
	// FenceNetstackEnv is "true" in pods whose netstack fence (the netfence init container,
	// docs/security.md#the-netstack-fence) must be in place: the check then also proves that
	// table, which refuses UDP to a loopback witness address where the agent itself listens, and
	// does not hold without it. Agents older than it ignore it; "false" or unset checks no table.
	FenceNetstackEnv = "SANDBOX_EXECUTOR_FENCE_NETSTACK"
	// FencePort is where a baked-in agent answers readiness probes (HTTP, any path).
	FencePort = 7544
)

// FenceTimeout is one connect's default bound. Under a policy that rejects (kube-router, and the
// netstack fence on a runsc with the REJECT target), a denied connect fails at once; under one
// that drops (Calico, Cilium, the netstack fence on an older runsc), it waits this long, and
// every check, prepare's included, pays it. A reachable canary near the pod answers in a few
// milliseconds.
const FenceTimeout = 250 * time.Millisecond

// FenceArgs is the agent command line for a fresh fence check; it prints a FenceReport.
func FenceArgs() []string { return []string{BinaryPath, "fence"} }

// FenceReport is the outcome of one fence check.
type FenceReport struct {
	// Configured: the pod names addresses to check. Without, Holds is false and means nothing.
	Configured bool `json:"configured"`
	Holds      bool `json:"holds"`
	// Problems say what does not hold, one per address: "denied canary 10.99.0.2:80 is reachable".
	Problems []string `json:"problems,omitempty"`
}

// String is the report in one line.
func (r FenceReport) String() string {
	switch {
	case !r.Configured:
		return "no egress fence check configured (" + FenceDenyEnv + ", " + FenceAllowEnv + ")"
	case r.Holds:
		return "the egress fence holds"
	}
	return strings.Join(r.Problems, "; ")
}
