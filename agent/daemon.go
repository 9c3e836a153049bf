package agent

import (
	"bufio"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The stage daemon is started once per job, at prepare, in a session of its own. It starts each
// stage's shell itself and waits for it, so a stage costs one process start in the pod (the
// shell) beyond the exec, instead of two (a supervisor, then the shell): process starts are
// what gVisor charges most for. When the daemon is not there, start falls back to a supervisor
// per stage, with the same files and guarantees.

// daemonSocket is where the daemon listens; only the container user can reach BaseDir.
func (a *Agent) daemonSocket() string { return filepath.Join(filepath.Dir(a.stagesDir), "agent.sock") }

// initCommand starts the job's daemon and reports on the pod. With --listen, the daemon also
// serves the network path, to executors of the agent CA read from stdin (base64 of its PEM, one
// line: the install exec sends it ahead of nothing else).
func (a *Agent) initCommand(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("init", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	listen := fs.String("listen", "", "also serve agent commands on this TCP address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *listen != "" {
		if err := a.saveClientCA(stdin); err != nil {
			return err
		}
	}
	if err := a.startDaemon(*listen, "--bound"); err != nil {
		return err
	}
	return a.probe(nil, stdout)
}

// saveClientCA keeps the agent CA sent on stdin for the daemon.
func (a *Agent) saveClientCA(stdin io.Reader) error {
	line, err := bufio.NewReader(io.LimitReader(stdin, 64<<10)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	pem, err := base64.StdEncoding.DecodeString(strings.TrimSpace(line))
	if err != nil || len(pem) == 0 {
		return errors.New("the network path needs the agent CA on stdin (base64 of its PEM)")
	}
	return writeFileAtomic(a.clientCAPath(), pem, 0o600)
}

// startDaemon starts the daemon unless one answers already, and returns once it listens.
func (a *Agent) startDaemon(listen string, flags ...string) error {
	if conn, err := net.DialTimeout("unix", a.daemonSocket(), time.Second); err == nil {
		conn.Close()
		return nil
	}
	if err := spawnDetached(append([]string{"daemon", "--stages", a.stagesDir, "--listen", listen}, flags...)...); err != nil {
		return fmt.Errorf("starting the stage daemon: %w", err)
	}
	return nil
}

func (a *Agent) daemonCommand(args []string) error {
	fs := flag.NewFlagSet("daemon", flag.ContinueOnError)
	fs.StringVar(&a.stagesDir, "stages", a.stagesDir, "stage directories")
	listen := fs.String("listen", "", "also serve agent commands on this TCP address, with the agent CA saved in the stages' parent directory")
	bound := fs.Bool("bound", false, "the pod already serves its job (init at prepare): keep a spare shell from the start")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ready := openReadyPipe()
	base := filepath.Dir(a.stagesDir)
	_ = os.Remove(a.daemonSocket())
	ln, err := net.Listen("unix", a.daemonSocket())
	if err != nil {
		return ready.fail(err)
	}
	// The pid lets tests that run the agent on the host stop the daemon they started.
	_ = writeFileAtomic(filepath.Join(base, "daemon.pid"), []byte(strconv.Itoa(os.Getpid())), 0o600)
	d := &daemon{agent: a, sparesDir: filepath.Join(base, "spares")}
	if shell, err := findShell(); err == nil {
		d.shell = shell // without one, every stage fails to start anyway, and says why
	}
	a.bound = d.keepSpares
	if *bound {
		d.keepSpares()
	}
	if *listen != "" {
		if err := a.listenNetwork(*listen); err != nil {
			return ready.fail(fmt.Errorf("serving the network path: %w", err))
		}
	}
	ready.ok()
	for {
		conn, err := ln.Accept()
		if err != nil {
			return err
		}
		go d.serveSpawn(conn)
	}
}

type daemon struct {
	agent     *Agent
	shell     string
	sparesDir string

	sparesOnce sync.Once
	mu         sync.Mutex
	spares     *spares // nil until keepSpares, or when starting them failed
}

// keepSpares starts keeping a spare shell ready. A spare runs the image's shell, so a daemon
// started with a warm pod waits until the pod is bound to its job (the network path admitted
// it, or the first stage arrived over exec): no code of the image runs in a pod no job has
// claimed yet. Without a spare, stages start on demand: slower, never wrong.
func (d *daemon) keepSpares() {
	d.sparesOnce.Do(func() {
		if d.shell == "" {
			return
		}
		sp, err := newSpares(d.shell, d.sparesDir)
		if err != nil {
			return
		}
		d.mu.Lock()
		d.spares = sp
		d.mu.Unlock()
	})
}

func (d *daemon) spare(shell string) *spare {
	d.mu.Lock()
	sp := d.spares
	d.mu.Unlock()
	return sp.take(shell)
}

// serveSpawn handles one "spawn DIR SHELL" request: it starts the stage and answers "ok" once
// its pgid is recorded, then waits for it and records its status.
func (d *daemon) serveSpawn(conn net.Conn) {
	defer conn.Close()
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return
	}
	fields := strings.Split(strings.TrimSuffix(line, "\n"), "\t")
	if len(fields) != 3 || fields[0] != "spawn" {
		fmt.Fprint(conn, "bad request")
		return
	}
	dir, shell := fields[1], fields[2]
	if err := d.agent.checkStageDir(dir); err != nil {
		fmt.Fprint(conn, err.Error())
		return
	}
	sp := d.spare(shell)
	// A stage binds the pod as surely as the network path's first job: the next stage gets a
	// spare.
	d.keepSpares()
	if sp != nil && sp.assign(dir) == nil {
		fmt.Fprint(conn, "ok")
		return
	}
	// Its own session: the stage's whole tree is one session to sweep on kill, and the daemon
	// (the keeper) is outside it.
	cmd, err := startStage(dir, shell, &syscall.SysProcAttr{Setsid: true}, 0)
	if err != nil {
		fmt.Fprint(conn, err.Error())
		return
	}
	fmt.Fprint(conn, "ok")
	conn.Close()
	_ = writeFileAtomic(filepath.Join(dir, "status"), []byte(strconv.Itoa(exitCode(cmd.Wait()))), 0o600)
}

// spawnViaDaemon asks the job's daemon to start the stage; errNoDaemon when there is none.
func (a *Agent) spawnViaDaemon(dir, shell string) error {
	conn, err := net.DialTimeout("unix", a.daemonSocket(), time.Second)
	if err != nil {
		return errNoDaemon
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := fmt.Fprintf(conn, "spawn\t%s\t%s\n", dir, shell); err != nil {
		return errNoDaemon
	}
	// Bounded: the job owns BaseDir and can put its own server at the socket, answering anything.
	answer, _ := io.ReadAll(io.LimitReader(conn, maxDaemonAnswer))
	if string(answer) != "ok" {
		return fmt.Errorf("starting stage: %s", strings.TrimSpace(string(answer)))
	}
	return nil
}

var errNoDaemon = errors.New("no stage daemon")

// maxDaemonAnswer bounds what is read of the daemon's answer: "ok" or one error line.
const maxDaemonAnswer = 4 << 10

// startStage starts the stage's shell with its output appended to out, and records the process
// group to stop on cancel, the session to sweep, and the keeper to spare (0: the session leader
// is the stage itself, nothing to spare).
func startStage(dir, shell string, attr *syscall.SysProcAttr, keeper int) (*exec.Cmd, error) {
	out, err := os.OpenFile(filepath.Join(dir, "out"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	cmd := exec.Command(shell, filepath.Join(dir, "script"))
	cmd.Env = stageEnv(os.Environ(), filepath.Join(filepath.Dir(filepath.Dir(dir)), "bin"))
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	pid := cmd.Process.Pid
	sid := pid
	if keeper != 0 {
		sid = keeper
	}
	for name, value := range map[string]int{"keeper": keeper, "sid": sid} {
		if err := writeFileAtomic(filepath.Join(dir, name), []byte(strconv.Itoa(value)), 0o600); err != nil {
			return nil, err
		}
	}
	// pgid last: its presence means "started", for re-attaches and kill.
	if err := writeFileAtomic(filepath.Join(dir, "pgid"), []byte(strconv.Itoa(pid)), 0o600); err != nil {
		return nil, err
	}
	return cmd, nil
}

// shellStartupVars make a shell run code of the image's before the script: BASH_ENV and ENV
// name files to source, SHELLOPTS with xtrace runs PS4's substitutions, BASHOPTS sets options.
// No stage shell inherits them, spare or not, so a stage starts the same way both ways, and
// nothing the image set runs before the job's own script.
var shellStartupVars = []string{"BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4"}

// stageEnv is a stage shell's environment: the container's, without shellStartupVars, and with
// bin (BinDir: next to the stages directory) first on PATH.
func stageEnv(env []string, bin string) []string {
	out := make([]string, 0, len(env)+1)
	path := "PATH=" + bin + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		switch {
		case name == "PATH":
			path = "PATH=" + bin + ":" + value
		case !slices.Contains(shellStartupVars, name):
			out = append(out, kv)
		}
	}
	return append(out, path)
}
