package executor

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/gitlab"
	"github.com/sandbox-executor/sandbox-executor/kube"
)

// StageRunner runs one stage script in the job pod through the in-pod agent: the stage runs
// detached, and a dropped exec stream re-attaches and resumes from the last byte delivered, until
// the agent reports the stage's exit status. A status that cannot be established is a system
// failure, never a success.
type StageRunner struct {
	Exec    kube.RemoteExecutor
	Sandbox *kube.Sandbox
	// PodGone explains why the pod cannot run stages any more ("" while it can).
	PodGone func(ctx context.Context) (string, error)
	Log     *gitlab.JobLog
	// Reconnects bounds re-attaches per stage.
	Reconnects int
	// Backoff schedules the waits before each re-attach (kube.RetryBackoff in production).
	Backoff wait.Backoff
	// KillGrace is how long the stage gets between SIGTERM and SIGKILL on cancel.
	KillGrace time.Duration
	// StagesDir is where the agent keeps stage directories; empty means wire.StagesDir. Tests
	// that run the agent on the host point it elsewhere.
	StagesDir string
	// ScriptTime is set by Run: how long the script ran in the pod, from the agent's "started"
	// acknowledgement to its exit status, as seen here (what is left of run's time is ours).
	ScriptTime time.Duration
}

// ErrCancelled is returned when the stage was stopped because the runner cancelled it.
var ErrCancelled = errors.New("stage cancelled")

// Run executes script as stage name, streaming its output to stdout, and returns its exit code.
// When ctx is cancelled (SIGTERM from the runner), it stops the stage's processes in the pod
// before it returns.
func (r *StageRunner) Run(ctx context.Context, name string, script []byte, stdout, stderr io.Writer) (int, error) {
	root := r.StagesDir
	if root == "" {
		root = wire.StagesDir
	}
	stageDir := path.Join(root, stageID(name))
	sum := sha256.Sum256(script)
	digest := hex.EncodeToString(sum[:])
	delivered := &countingWriter{w: stdout}
	started := false
	var startedAt time.Time
	retry := r.Backoff
	for attempt := 0; ; attempt++ {
		ctrl := newControlReader(stderr)
		err := r.Exec.Exec(ctx, kube.ExecRequest{
			Namespace: r.Sandbox.Namespace, Pod: r.Sandbox.Pod, Container: r.Sandbox.Container,
			Command: wire.StartArgs(stageDir, len(script), digest, delivered.n, started),
			Stdin:   bytes.NewReader(script),
			Stdout:  delivered,
			Stderr:  ctrl,
		})
		ctrl.Close()
		if !started && ctrl.Started() {
			started, startedAt = true, ctrl.startedAt
		}
		if code, ok := ctrl.Status(); ok {
			if started {
				r.ScriptTime = ctrl.statusAt.Sub(startedAt)
			}
			return code, nil
		}
		if ctx.Err() != nil {
			return 0, r.stop(stageDir, name)
		}
		if delivered.err != nil {
			return 0, failure.SystemError(delivered.err, "writing stage %s output to the runner", name)
		}
		// Whatever went wrong, a pod that is gone explains it best. A failed check proves
		// nothing (an API server that just restarted denies requests until its caches sync):
		// the re-attach decides.
		if why, gerr := r.PodGone(ctx); why != "" {
			return 0, failure.SystemError(nil, "stage %s: %s", name, why)
		} else if gerr != nil {
			r.Log.Debugf("checking pod %s: %v", r.Sandbox.Pod, gerr)
		}
		var refused *RefusedError
		if errors.As(err, &refused) {
			// The agent served this job at prepare and its key is pinned, so this is the same
			// agent refusing the job now (bad arguments from a mismatched executor, or the pod
			// bound to another job): asking again gets the same answer, and the stage cannot be
			// followed.
			return 0, failure.SystemError(nil, "stage %s: the stage agent in pod %s refused this job's stage (%s); it cannot be followed", name, r.Sandbox.Pod, refused.Reason)
		}
		var exit *kube.ExitError
		if errors.As(err, &exit) && exit.Code == wire.ExitAgentFailure {
			// The agent ran and said why it could not run the stage (already on stderr).
			return 0, failure.SystemError(nil, "stage %s: the in-pod agent failed: %s", name, ctrl.LastText())
		}
		if err == nil {
			err = errors.New("stream ended without the stage's exit status")
		}
		// Any other exit (the agent killed by a signal, say) is a lost stream like any other.
		if attempt >= r.Reconnects {
			return 0, failure.SystemError(err, "stage %s: lost the stream to pod %s %d times; its exit status is unknown", name, r.Sandbox.Pod, attempt+1)
		}
		r.Log.Warnf("Stream to pod %s dropped (%s); re-attaching at byte %d (attempt %d/%d)", r.Sandbox.Pod, failure.OneLine(err.Error()), delivered.n, attempt+1, r.Reconnects)
		select {
		case <-time.After(retry.Step()):
		case <-ctx.Done():
			return 0, r.stop(stageDir, name)
		}
	}
}

// stop kills the stage's process tree in the pod. It runs on its own short context: the
// stage's context is already cancelled.
func (r *StageRunner) stop(stageDir, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), r.KillGrace+15*time.Second)
	defer cancel()
	// Bounded: only the head of stderr becomes the error, and the pod can answer with anything.
	stderr := newHeadBuffer(maxKeptText)
	err := r.Exec.Exec(ctx, kube.ExecRequest{
		Namespace: r.Sandbox.Namespace, Pod: r.Sandbox.Pod, Container: r.Sandbox.Container,
		Command: wire.KillArgs(stageDir, int(r.KillGrace/time.Second)),
		Stdout:  io.Discard, Stderr: stderr,
	})
	if err != nil {
		return failure.SystemError(nil, "stage %s cancelled, but stopping its processes in pod %s failed: %s", name, r.Sandbox.Pod, failure.OneLine(strings.TrimSpace(stderr.Line()+" "+err.Error())))
	}
	r.Log.Warnf("Stage %s cancelled: its processes in pod %s were stopped", name, r.Sandbox.Pod)
	return &failure.Error{Kind: failure.KindSystem, Err: ErrCancelled, Msg: "stage " + name}
}

// stageID is unique per invocation: the runner may run a stage name more than once (retries of
// get_sources), and each run must have its own output and status.
func stageID(name string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	clean := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-' {
			return r
		}
		return '-'
	}, strings.ToLower(name))
	if len(clean) > 64 {
		clean = clean[:64]
	}
	return clean + "-" + hex.EncodeToString(b[:])
}

// countingWriter counts the bytes the job log has received: the offset to resume from.
type countingWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	if err != nil {
		c.err = err
	}
	return n, err
}

// controlReader splits the agent's stderr into control lines (status, heartbeats), which it
// keeps, and text, which it passes on.
type controlReader struct {
	pw   *io.PipeWriter
	done chan struct{}

	mu        sync.Mutex
	started   bool
	status    *int
	lastText  string
	startedAt time.Time
	statusAt  time.Time
}

func newControlReader(passthrough io.Writer) *controlReader {
	pr, pw := io.Pipe()
	c := &controlReader{pw: pw, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if ctl, ok := wire.ParseControl(line); ok {
				c.mu.Lock()
				switch {
				case ctl.Started:
					c.started, c.startedAt = true, time.Now()
				case !ctl.Heartbeat:
					c.status, c.statusAt = &ctl.Status, time.Now()
				}
				c.mu.Unlock()
				continue
			}
			c.mu.Lock()
			c.lastText = line
			c.mu.Unlock()
			fmt.Fprintln(passthrough, line)
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	return c
}

func (c *controlReader) Write(p []byte) (int, error) { return c.pw.Write(p) }

// Close ends the stream and waits until every line has been handled.
func (c *controlReader) Close() {
	c.pw.Close()
	<-c.done
}

func (c *controlReader) Status() (int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.status == nil {
		return 0, false
	}
	return *c.status, true
}

// Started reports whether the agent acknowledged that the stage runs.
func (c *controlReader) Started() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.started
}

func (c *controlReader) LastText() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lastText == "" {
		return "no message"
	}
	return c.lastText
}
