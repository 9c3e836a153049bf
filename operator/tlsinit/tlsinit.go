// Package tlsinit implements `sandbox-executor tls init`: it makes the agent CA, the key the
// runners prove themselves to the in-pod agents with (docs/security.md#the-network-transport).
package tlsinit

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/sandbox-executor/sandbox-executor/agentca"
	"github.com/sandbox-executor/sandbox-executor/failure"
)

// Command is the tls verb and its init subcommand.
func Command() *cli.Command {
	return &cli.Command{
		Name:  "tls",
		Usage: "the agent CA of the network transport",
		Subcommands: []*cli.Command{{
			Name:  "init",
			Usage: "make a new agent CA: tls.crt (for the job pods' ConfigMap) and tls.key (for the runners only)",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "dir", Usage: "directory to write tls.crt and tls.key into (created 0700)"},
				&cli.DurationFlag{Name: "validity", Value: 5 * 365 * 24 * time.Hour, Usage: "how long the CA signs usable certificates"},
				&cli.StringFlag{Name: "name", Value: "sandbox-executor agent CA", Usage: "the CA's common name"},
			},
			Action: func(c *cli.Context) error {
				return Run(c.App.Writer, Options{Dir: c.String("dir"), Validity: c.Duration("validity"), Name: c.String("name")})
			},
		}},
	}
}

// Options say where the CA goes and for how long it serves.
type Options struct {
	Dir      string
	Validity time.Duration
	Name     string
}

// Run writes a new CA into opts.Dir, never over an existing one (a CA replaced by accident
// locks every runner out of every warm pod), and says how to install it.
func Run(out io.Writer, opts Options) error {
	if opts.Dir == "" {
		return failure.PermanentError(nil, "tls init: --dir is required: the directory to write tls.crt and tls.key into")
	}
	if opts.Validity < 24*time.Hour {
		return failure.PermanentError(nil, "--validity %s is too short: the CA must outlive the pods that trust it (at least 24h)", opts.Validity)
	}
	cert, key := filepath.Join(opts.Dir, "tls.crt"), filepath.Join(opts.Dir, "tls.key")
	for _, f := range []string{cert, key} {
		if _, err := os.Stat(f); err == nil {
			return failure.PermanentError(nil, "%s exists: move it away first to make a new agent CA (rotation: docs/security.md#rotating-the-agent-ca)", f)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return failure.PermanentError(nil, "%v", err)
		}
	}
	certPEM, keyPEM, err := agentca.Generate(opts.Name, opts.Validity)
	if err != nil {
		return failure.SystemError(err, "making the agent CA: %v", err)
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return failure.PermanentError(nil, "%v", err)
	}
	// The key first and exclusively: it is the secret; the certificate is public.
	if err := writeNew(key, keyPEM, 0o600); err != nil {
		return err
	}
	if err := writeNew(cert, certPEM, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(out, `Agent CA written: %s (public) and %s (secret: runners only, never a job pod).
Install it (namespace of the pools and runners):
  kubectl -n NAMESPACE create configmap sandbox-executor-agent-ca --from-file=ca.crt=%s
  kubectl -n NAMESPACE create secret tls sandbox-executor-agent-ca --cert=%s --key=%s
and set agent_ca_cert and agent_ca_key in the runner's config.toml to where the Secret is mounted.
`, cert, key, cert, cert, key)
	return nil
}

func writeNew(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return failure.PermanentError(nil, "%v", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return failure.SystemError(err, "writing %s: %v", path, err)
	}
	if err := f.Close(); err != nil {
		return failure.SystemError(err, "writing %s: %v", path, err)
	}
	return nil
}
