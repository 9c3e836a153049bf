package agent

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
)

// A spare is a stage shell started ahead of time, waiting for its script's path on a pipe. A
// process start is the dearest thing gVisor does (tens of milliseconds: the Sentry builds a new
// address space and loads the shell and its libraries), so the daemon keeps one spare ready
// and a stage costs a pipe write instead. The spare sources the script: the same shell, the
// same file, run by the same process that would otherwise have been started for it.
type spare struct {
	cmd    *exec.Cmd
	shell  string
	dir    string   // holds the spare's output file until the spare is given a stage
	feed   *os.File // the write end of the pipe the shell reads the script's path from
	exited chan int // the shell's exit code, once it has ended
}

// spareScript reads the script's path from fd 3 and sources it. Separate lines, not an &&
// list: errexit set by the script must apply to the script's own commands.
const spareScript = `IFS= read -r sandbox_executor_script <&3 || exit 125
exec 3<&-
. "$sandbox_executor_script"
`

func startSpare(shell, sparesDir string) (*spare, error) {
	dir, err := os.MkdirTemp(sparesDir, "spare-")
	if err != nil {
		return nil, err
	}
	out, err := os.OpenFile(filepath.Join(dir, "out"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	defer out.Close()
	feedR, feedW, err := os.Pipe()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	defer feedR.Close()
	cmd := exec.Command(shell, "-c", spareScript)
	cmd.Env = stageEnv(os.Environ(), filepath.Join(filepath.Dir(sparesDir), "bin"))
	cmd.Stdout, cmd.Stderr = out, out
	cmd.ExtraFiles = []*os.File{feedR}
	// Its own session, as a stage started on demand: the stage's whole tree is one session.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		feedW.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	s := &spare{cmd: cmd, shell: shell, dir: dir, feed: feedW, exited: make(chan int, 1)}
	go func() { s.exited <- exitCode(cmd.Wait()) }()
	return s, nil
}

var errSpareGone = errors.New("the spare shell is gone")

// assign gives the spare the stage in dir, whose script is written. The stage's files are the
// same as for a stage started on demand; on error nothing of the stage is left and the caller
// starts it afresh.
func (s *spare) assign(dir string) error {
	defer os.RemoveAll(s.dir)
	select {
	case <-s.exited:
		s.feed.Close()
		return errSpareGone
	default:
	}
	pid := s.cmd.Process.Pid
	undo := func(err error) error {
		for _, name := range []string{"pgid", "sid", "keeper", "out"} {
			os.Remove(filepath.Join(dir, name))
		}
		s.feed.Close()
		_ = s.cmd.Process.Kill()
		return err
	}
	if err := os.Rename(filepath.Join(s.dir, "out"), filepath.Join(dir, "out")); err != nil {
		return undo(err)
	}
	for _, f := range []struct {
		name  string
		value int
	}{{"keeper", 0}, {"sid", pid}, {"pgid", pid}} { // pgid last: it means "started"
		if err := writeFileAtomic(filepath.Join(dir, f.name), []byte(strconv.Itoa(f.value)), 0o600); err != nil {
			return undo(err)
		}
	}
	// A spare that died just now fails this write (EPIPE): it never read a path, so nothing ran.
	if _, err := s.feed.WriteString(filepath.Join(dir, "script") + "\n"); err != nil {
		return undo(errSpareGone)
	}
	s.feed.Close()
	go func() {
		_ = writeFileAtomic(filepath.Join(dir, "status"), []byte(strconv.Itoa(<-s.exited)), 0o600)
	}()
	return nil
}

// spares keeps one spare shell started or starting.
type spares struct {
	shell string
	dir   string
	next  chan *spare // the spare being started; nil if starting it failed
}

func newSpares(shell, dir string) (*spares, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	s := &spares{shell: shell, dir: dir, next: make(chan *spare, 1)}
	s.refill()
	return s, nil
}

func (s *spares) refill() {
	go func() {
		sp, err := startSpare(s.shell, s.dir)
		if err != nil {
			sp = nil
		}
		s.next <- sp
	}()
}

// take returns the spare (waiting for it if it is still starting: it is ready sooner than a
// fresh start would be) and starts the next one. nil: start the stage on demand.
func (s *spares) take(shell string) *spare {
	if s == nil || shell != s.shell {
		return nil
	}
	sp := <-s.next
	s.refill()
	return sp
}
