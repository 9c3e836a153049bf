package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"hash"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
)

// Templates can bake the agent into their pods: an init container runs "install" to copy the
// agent into a volume, and the job container's command is "serve". The stage daemon then runs
// from the moment the warm pod starts, with a spare shell ready, and a claimed pod needs no
// copy and no exec at prepare: the executor pins the agent's key from the pod's log and talks
// TLS to it.

// networkOff says why the pod serves no network path ("" when it does).
func networkOff(getenv func(string) string) string {
	if getenv(wire.ClientCAEnv) == "" {
		return "the pod has no agent CA (" + wire.ClientCAEnv + " in its SandboxTemplate); stages go over exec"
	}
	return ""
}

// installCommand copies this binary to DEST, for an init container; with HELPER_SRC and
// HELPER_DEST, also the runner's helper binary the agent image carries, if it carries one (an
// image without it leaves the executor to copy the helper at prepare, as before), and writes
// the helper's sha256, computed as it copies, beside it (HELPER_DEST + wire.HelperDigestSuffix):
// the helper command then need not hash it in the pod at prepare.
func installCommand(args []string) error {
	if (len(args) != 1 && len(args) != 3) || !filepath.IsAbs(args[0]) || (len(args) == 3 && (!filepath.IsAbs(args[1]) || !filepath.IsAbs(args[2]))) {
		return errors.New("usage: install DEST [HELPER_SRC HELPER_DEST] (absolute paths)")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if err := copyFile(self, args[0], nil); err != nil {
		return err
	}
	if len(args) == 3 {
		if _, err := os.Stat(args[1]); errors.Is(err, os.ErrNotExist) {
			return nil
		}
		// A digest file left by an earlier run of the init container (the pod's emptyDir
		// outlives a container restart) goes first: one beside the helper is that helper's.
		digestPath := args[2] + wire.HelperDigestSuffix
		if err := os.Remove(digestPath); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		h := sha256.New()
		if err := copyFile(args[1], args[2], h); err != nil {
			return err
		}
		return writeFile(digestPath, 0o644, func(w io.Writer) error {
			_, err := fmt.Fprintln(w, hex.EncodeToString(h.Sum(nil)))
			return err
		})
	}
	return nil
}

// copyFile copies from to to (mode 0755), through a temporary file renamed into place; with h
// (else nil), it also hashes what it copies.
func copyFile(from, to string, h hash.Hash) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	return writeFile(to, 0o755, func(w io.Writer) error {
		if h != nil {
			w = io.MultiWriter(w, h)
		}
		_, err := io.Copy(w, src)
		return err
	})
}

// writeFile writes to (with mode) through write and a temporary file renamed into place.
func writeFile(to string, mode os.FileMode, write func(io.Writer) error) error {
	tmp := to + ".tmp"
	dst, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if err := write(dst); err != nil {
		dst.Close()
		return err
	}
	if err := dst.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, to)
}

// serveCommand runs as the job container's command: it lays out BaseDir, starts the stage
// daemon (serving the network path when the pod was given the agent CA), logs the daemon's
// identity, and reaps: as the container's PID 1 it inherits every orphaned process of the job's
// stages.
func (a *Agent) serveCommand(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	listen := fs.String("listen", fmt.Sprintf(":%d", wire.NetworkPort), "serve agent commands on this TCP address too")
	fenceListen := fs.String("fence-listen", fmt.Sprintf(":%d", wire.FencePort), "answer readiness probes with the egress fence check here, if the pod configures one")
	fs.StringVar(&a.stagesDir, "stages", a.stagesDir, "stage directories (tests move them)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	base := filepath.Dir(a.stagesDir)
	if err := os.MkdirAll(a.stagesDir, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(base, 0o700); err != nil {
		return err
	}
	// Stage commands name BinaryPath, wherever the agent was installed.
	link := filepath.Join(base, filepath.Base(wire.BinaryPath))
	if target, err := os.Readlink(link); err != nil || target != self {
		_ = os.Remove(link)
		if err := os.Symlink(self, link); err != nil {
			return err
		}
	}
	terms := make(chan os.Signal, 1)
	// PID 1 gets no default action for SIGTERM: end promptly when the pod is deleted.
	signal.Notify(terms, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-terms; os.Exit(0) }()

	daemonArgs := []string{"daemon", "--stages", a.stagesDir}
	network := networkOff(os.Getenv)
	if network == "" {
		if err := writeFileAtomic(a.clientCAPath(), []byte(os.Getenv(wire.ClientCAEnv)), 0o600); err != nil {
			return err
		}
		daemonArgs = append(daemonArgs, "--listen", *listen)
	}
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer readyR.Close()
	cmd := exec.Command(self, daemonArgs...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{readyW}
	if err := cmd.Start(); err != nil {
		readyW.Close()
		return err
	}
	readyW.Close()
	if msg, _ := io.ReadAll(readyR); string(msg) != "ok" {
		return fmt.Errorf("starting the stage daemon: %s", strings.TrimSpace(string(msg)))
	}
	// The first line of the pod's log, before anything can make the pod Ready: the executor
	// reads it over the API server to pin the agent's key (wire.ParseFirstLogLine).
	if network == "" {
		fmt.Fprint(stdout, wire.IdentityLine(a.networkIdentity()))
	} else {
		fmt.Fprint(stdout, wire.NetworkOffLine(network))
	}
	// Listening only when the template names a fence: a readiness probe on a template that
	// forgot the addresses is refused, and the pod never Ready, rather than passing unchecked.
	if fence := FenceFromEnv(os.Getenv); fence.Configured() {
		// On every address of the pod, as the network path: only the agent may send from it.
		ln, err := listenEvery(*fenceListen)
		if err != nil {
			return fmt.Errorf("the fence check's readiness port: %w", err)
		}
		go func() { _ = ServeFence(ln, fence) }()
	}
	fmt.Fprintln(stdout, "sandbox-executor-agent: stage daemon ready")
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if pid == cmd.Process.Pid {
			return fmt.Errorf("the stage daemon ended (status %#x)", ws)
		}
	}
}
