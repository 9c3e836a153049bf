package agent

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent/netfence"
	"github.com/sandbox-executor/sandbox-executor/agent/wire"
)

// Options configure an agent. The zero value is the agent as it runs in a job pod.
type Options struct {
	// StagesDir holds one directory per stage invocation; wire.StagesDir when empty. A test that
	// runs the agent on the host points it at a temporary directory.
	StagesDir string
}

// Agent runs agent commands against one stages directory.
type Agent struct {
	stagesDir string
	// bound is called once, when the network path first admits a job: from then on the pod is
	// that job's (nil: nothing to do).
	bound func()
}

// New makes an agent with opts.
func New(opts Options) *Agent {
	a := &Agent{stagesDir: opts.StagesDir}
	if a.stagesDir == "" {
		a.stagesDir = wire.StagesDir
	}
	return a
}

// StagesDir is where this agent keeps stage directories.
func (a *Agent) StagesDir() string { return a.stagesDir }

// Main runs one agent command, as it runs in a job pod, and returns its exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return New(Options{}).Run(args, stdin, stdout, stderr)
}

// Run runs one agent command and returns its exit code.
func (a *Agent) Run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) < 1 {
		fmt.Fprintln(stderr, "usage: sandbox-executor-agent init|probe|fence|netfence|start|kill|serve|install|helper [flags]")
		return 2
	}
	cmd, args := args[0], args[1:]
	var err error
	switch cmd {
	case "probe":
		err = a.probe(args, stdout)
	case "fence":
		err = fenceCommand(stdout)
	case "netfence":
		err = netfence.Command(args, stdout)
	case "start":
		err = a.startCommand(args, stdin, stdout, stderr)
	case "kill":
		err = a.killCommand(args, stdout)
	case "supervise":
		err = superviseCommand(args)
	case "init":
		err = a.initCommand(args, stdin, stdout)
	case "daemon":
		err = a.daemonCommand(args)
	case "serve":
		err = a.serveCommand(args, stdout)
	case "install":
		err = installCommand(args)
	case "helper":
		err = helperCommand(args, stdout)
	default:
		err = fmt.Errorf("unknown command %q", cmd)
	}
	if err != nil {
		fmt.Fprintf(stderr, "sandbox-executor-agent %s: %v\n", cmd, err)
		return wire.ExitAgentFailure
	}
	return 0
}

// shellCandidates: the runner's scripts are written for bash and fall back to POSIX sh.
var shellCandidates = []string{"/bin/bash", "/usr/bin/bash", "/usr/local/bin/bash", "/bin/sh", "/usr/bin/sh"}

func findShell() (string, error) {
	for _, s := range shellCandidates {
		if fi, err := os.Stat(s); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return s, nil
		}
	}
	return "", errors.New("the image has neither bash nor sh")
}

// probe prints the pod's wire.Probe; with --fence, a fresh fence check in it (wire.ProbeArgs).
func (a *Agent) probe(args []string, stdout io.Writer) error {
	withFence := slices.Contains(args, "--fence")
	shell, err := findShell()
	if err != nil {
		return err
	}
	var uts syscall.Utsname
	if err := syscall.Uname(&uts); err != nil {
		return err
	}
	p := wire.Probe{Shell: shell, KernelRelease: utsString(uts.Release[:]), KernelVersion: utsString(uts.Version[:]), UID: os.Getuid(), Identity: a.networkIdentity()}
	if withFence {
		report := FenceFromEnv(os.Getenv).Check()
		p.Fence = &report
	}
	return json.NewEncoder(stdout).Encode(p)
}

func utsString(field []int8) string {
	b := make([]byte, 0, len(field))
	for _, c := range field {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

type startOptions struct {
	dir    string
	size   int
	sha256 string
	offset int64
	resume bool
}

func (a *Agent) startCommand(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	var o startOptions
	fs := flag.NewFlagSet("start", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.dir, "dir", "", "stage directory")
	fs.IntVar(&o.size, "size", -1, "script size in bytes")
	fs.StringVar(&o.sha256, "sha256", "", "script SHA-256, hex")
	fs.Int64Var(&o.offset, "offset", 0, "resume output from this byte")
	fs.BoolVar(&o.resume, "resume", false, "the stage was started before: never start it again")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := a.checkStageDir(o.dir); err != nil {
		return err
	}
	if o.size < 0 || len(o.sha256) != 64 || o.offset < 0 {
		return errors.New("--size, --sha256 and a non-negative --offset are required")
	}
	if err := a.ensureStarted(o, stdin); err != nil {
		return err
	}
	if _, err := io.WriteString(stderr, wire.StartedLine()); err != nil {
		return err
	}
	a.removeFinishedSiblings(o.dir)
	code, err := follow(o.dir, o.offset, stdout, stderr)
	if err != nil {
		return err
	}
	_, err = io.WriteString(stderr, wire.StatusLine(code))
	return err
}

// checkStageDir keeps every path the agent writes inside StagesDir.
func (a *Agent) checkStageDir(dir string) error {
	if dir == "" || filepath.Dir(filepath.Clean(dir)) != a.stagesDir {
		return fmt.Errorf("--dir must be a directory directly under %s", a.stagesDir)
	}
	return nil
}

// ensureStarted starts the stage unless an earlier attempt already did. A stream can drop while
// the first start is still running, so starts are serialised with a lock in the stage directory.
func (a *Agent) ensureStarted(o startOptions, stdin io.Reader) error {
	if err := os.MkdirAll(o.dir, 0o700); err != nil {
		return err
	}
	lock, err := os.OpenFile(filepath.Join(o.dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("locking stage: %w", err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)

	if _, err := os.Stat(filepath.Join(o.dir, "pgid")); err == nil {
		return nil // already running or done: just re-attach
	}
	if o.resume {
		return errors.New("the stage is gone from the pod (its container restarted, or its files were deleted): not starting it again")
	}
	script, err := readScript(stdin, o.size, o.sha256)
	if err != nil {
		return err
	}
	scriptPath := filepath.Join(o.dir, "script")
	if err := writeFileAtomic(scriptPath, script, 0o700); err != nil {
		return err
	}
	shell, err := findShell()
	if err != nil {
		return err
	}
	if err := a.spawnViaDaemon(o.dir, shell); err != errNoDaemon {
		return err
	}
	return spawnSupervisor(o.dir, shell)
}

// readScript reads exactly size bytes and checks their digest: a stream cut mid-script must
// never run the part that arrived.
func readScript(r io.Reader, size int, sha string) ([]byte, error) {
	buf := make([]byte, size)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, fmt.Errorf("script truncated in transit (%v): not started", err)
	}
	sum := sha256.Sum256(buf)
	if hex.EncodeToString(sum[:]) != strings.ToLower(sha) {
		return nil, errors.New("script checksum mismatch: not started")
	}
	return buf, nil
}

func spawnSupervisor(dir, shell string) error {
	if err := spawnDetached("supervise", "--dir", dir, "--shell", shell); err != nil {
		return fmt.Errorf("starting stage: %w", err)
	}
	return nil
}

// spawnDetached starts this binary with args in a session of its own and returns once it says
// "ok" on the ready pipe (fd 3), or what it said instead. Its own session: no signal aimed at
// the exec'd process group reaches it, and it outlives this process when the exec stream drops.
func spawnDetached(args ...string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer readyR.Close()
	cmd := exec.Command(self, args...)
	cmd.ExtraFiles = []*os.File{readyW}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		readyW.Close()
		return err
	}
	readyW.Close()
	msg, _ := io.ReadAll(readyR)
	// It lives on; release it so it is not left a zombie of ours if we exit first.
	_ = cmd.Process.Release()
	if string(msg) != "ok" {
		return errors.New(strings.TrimSpace(string(msg)))
	}
	return nil
}

func superviseCommand(args []string) error {
	fs := flag.NewFlagSet("supervise", flag.ContinueOnError)
	dir := fs.String("dir", "", "stage directory")
	shell := fs.String("shell", "/bin/sh", "shell")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ready := openReadyPipe()
	// The stage in a process group of its own, in this supervisor's session: kill stops the
	// group and sweeps the session, sparing the supervisor so it records the status.
	cmd, err := startStage(*dir, *shell, &syscall.SysProcAttr{Setpgid: true}, os.Getpid())
	if err != nil {
		return ready.fail(err)
	}
	ready.ok()
	code := exitCode(cmd.Wait())
	return writeFileAtomic(filepath.Join(*dir, "status"), []byte(strconv.Itoa(code)), 0o600)
}

// exitCode follows the shell convention: 128+N for a process killed by signal N.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return wire.ExitAgentFailure
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// readStatus returns the stage's exit code once the supervisor has recorded it.
func readStatus(dir string) (int, bool) {
	data, err := os.ReadFile(filepath.Join(dir, "status"))
	if err != nil {
		return 0, false
	}
	code, err := strconv.Atoi(string(bytes.TrimSpace(data)))
	return code, err == nil
}

// removeFinishedSiblings frees the pod's disk from earlier stages' output: the runner runs a
// job's stages one after another, so once a new stage starts the old ones have been delivered.
func (a *Agent) removeFinishedSiblings(dir string) {
	entries, err := os.ReadDir(a.stagesDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		sibling := filepath.Join(a.stagesDir, e.Name())
		if sibling == filepath.Clean(dir) {
			continue
		}
		if _, done := readStatus(sibling); done {
			os.RemoveAll(sibling)
		}
	}
}

// Poll intervals for following output: fast at first so short stages end promptly, then slower
// so a long silent stage costs next to nothing.
const (
	minPoll = time.Millisecond
	maxPoll = 20 * time.Millisecond
)

// follow copies the stage's output from offset to stdout until the stage has ended and every
// byte has been sent, and returns its exit code.
func follow(dir string, offset int64, stdout, ctrl io.Writer) (int, error) {
	f, err := os.Open(filepath.Join(dir, "out"))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return 0, err
	}
	buf := make([]byte, 256<<10)
	wait, lastSent := minPoll, time.Now()
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if _, werr := stdout.Write(buf[:n]); werr != nil {
				return 0, werr
			}
			wait, lastSent = minPoll, time.Now()
			continue
		}
		if err != nil && err != io.EOF {
			return 0, err
		}
		if code, done := readStatus(dir); done {
			// The status is written after the stage's shell exited: drain what it wrote last.
			if _, err := io.CopyBuffer(stdout, f, buf); err != nil {
				return 0, err
			}
			return code, nil
		}
		if time.Since(lastSent) >= wire.HeartbeatEvery {
			if _, err := io.WriteString(ctrl, wire.HeartbeatLine()); err != nil {
				return 0, err
			}
			lastSent = time.Now()
		}
		time.Sleep(wait)
		wait = min(wait*2, maxPoll)
	}
}

// readyPipe is fd 3, on which the command that started this one waits for "ok" or what failed.
type readyPipe struct{ *os.File }

// openReadyPipe takes fd 3, which came without close-on-exec: what this process starts must not
// inherit it, or the waiting command would wait until that ends too.
func openReadyPipe() readyPipe {
	syscall.CloseOnExec(3)
	return readyPipe{os.NewFile(3, "ready")}
}

// ok says this process is up.
func (r readyPipe) ok() {
	fmt.Fprint(r, "ok")
	r.Close()
}

// fail says why this process could not start, and returns err.
func (r readyPipe) fail(err error) error {
	fmt.Fprint(r, err.Error())
	r.Close()
	return err
}
