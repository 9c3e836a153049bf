package agent

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
)

// The daemon serves agent commands over the pod network too (wire.NetworkPort), over mutually
// authenticated TLS (serverTLS): only an executor holding a client certificate from the
// installation's agent CA gets in, and only for the job the pod serves.

// networkCommands are the only agent commands served over the network: the stages', the probe
// and fence check, and prepare's check and link of the baked runner helper (a Kubernetes exec
// for it costs a process start in the sandbox, 0.2 s on a loaded node).
var networkCommands = []string{"start", "kill", "probe", "fence", "helper"}

func (a *Agent) clientCAPath() string {
	return filepath.Join(filepath.Dir(a.stagesDir), "client-ca.pem")
}
func (a *Agent) identityPath() string { return filepath.Join(filepath.Dir(a.stagesDir), "identity") }

// ServeNetwork serves agent commands on ln, as the daemon does on the pod network, to executors
// whose client certificates clientCAPEM signed. It records the agent's identity for "probe" (and
// so for the install exec, which reports it), returns it, and serves until ln is closed.
func (a *Agent) ServeNetwork(ln net.Listener, clientCAPEM []byte) (string, error) {
	config, identity, err := serverTLS(clientCAPEM)
	if err != nil {
		return "", err
	}
	if err := writeFileAtomic(a.identityPath(), []byte(identity), 0o644); err != nil {
		return "", err
	}
	go func() { _ = a.serveNetwork(tls.NewListener(ln, config)) }()
	return identity, nil
}

func (a *Agent) serveNetwork(ln net.Listener) error {
	pod := &owner{bound: a.bound}
	for {
		conn, err := ln.Accept()
		if err != nil {
			return err
		}
		go a.serveConn(conn.(*tls.Conn), pod)
	}
}

func (a *Agent) serveConn(conn *tls.Conn, pod *owner) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if err := conn.Handshake(); err != nil {
		return // no certificate of the agent CA, or not TLS 1.3: nothing is read, nothing runs
	}
	r := bufio.NewReaderSize(conn, 64<<10)
	line, err := r.ReadString('\n')
	if err != nil {
		return
	}
	fw := &frameWriter{w: conn}
	refuse := func(msg string) {
		_ = fw.frame(wire.FrameStderr, []byte(msg+"\n"))
		_ = fw.frame(wire.FrameExit, []byte(strconv.Itoa(wire.ExitRefused)))
	}
	job, err := jobOf(conn.ConnectionState())
	if err != nil {
		refuse(err.Error())
		return
	}
	req, err := wire.ParseRequestHeader(line)
	switch {
	case err != nil:
		refuse(err.Error())
		return
	case !slices.Contains(networkCommands, req.Args[0]):
		refuse("bad arguments")
		return
	case !pod.admit(job):
		refuse("this sandbox belongs to another job")
		return
	}
	_ = conn.SetDeadline(time.Time{})
	code := a.Run(req.Args, io.LimitReader(r, int64(req.StdinLen)), fw.stream(wire.FrameStdout), fw.stream(wire.FrameStderr))
	_ = fw.frame(wire.FrameExit, []byte(strconv.Itoa(code)))
}

// listenNetwork starts the network path on addr (and, for a wildcard addr, on its port of every
// address of the pod: listenEvery) with the agent CA saved at the client-CA path.
func (a *Agent) listenNetwork(addr string) error {
	clientCA, err := os.ReadFile(a.clientCAPath())
	if err != nil {
		return err
	}
	ln, err := listenEvery(addr)
	if err != nil {
		return err
	}
	if _, err := a.ServeNetwork(ln, clientCA); err != nil {
		ln.Close()
		return err
	}
	return nil
}

// networkIdentity is the daemon's identity when it serves the network path, else "".
func (a *Agent) networkIdentity() string {
	data, err := os.ReadFile(a.identityPath())
	if err != nil {
		return ""
	}
	if id := strings.TrimSpace(string(data)); wire.ValidIdentity(id) {
		return id
	}
	return ""
}

// frameWriter serialises the frames of one connection's streams.
type frameWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (f *frameWriter) frame(kind byte, p []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return wire.WriteFrame(f.w, kind, p)
}

type streamWriter struct {
	f    *frameWriter
	kind byte
}

func (s streamWriter) Write(p []byte) (int, error) {
	if err := s.f.frame(s.kind, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (f *frameWriter) stream(kind byte) io.Writer { return streamWriter{f, kind} }
