// Package tlsinit implements `sandbox-executor tls init`: it makes the agent CA, the key the
// runners prove themselves to the in-pod agents with (docs/security.md#the-network-transport).
package tlsinit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/sandbox-executor/sandbox-executor/agentca"
	"github.com/sandbox-executor/sandbox-executor/config"
	"github.com/sandbox-executor/sandbox-executor/failure"
	"github.com/sandbox-executor/sandbox-executor/kube"
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
				&cli.StringFlag{Name: "secret", Usage: "instead of --dir: make the CA in the cluster as this TLS Secret, only when it does not exist, and the ConfigMap of its certificate (the chart's hook Job)"},
				&cli.StringFlag{Name: "configmap", Usage: "with --secret: the ConfigMap's name (default: the Secret's)"},
				&cli.StringFlag{Name: "namespace", Usage: "with --secret: their namespace (default: the pod's own)"},
				&cli.DurationFlag{Name: "validity", Value: 5 * 365 * 24 * time.Hour, Usage: "how long the CA signs usable certificates"},
				&cli.StringFlag{Name: "name", Value: "sandbox-executor agent CA", Usage: "the CA's common name"},
			},
			Action: func(c *cli.Context) error {
				opts := Options{Dir: c.String("dir"), Validity: c.Duration("validity"), Name: c.String("name")}
				secret := c.String("secret")
				switch {
				case (opts.Dir == "") == (secret == ""):
					return failure.PermanentError(nil, "tls init takes one of --dir (files) or --secret (in the cluster)")
				case opts.Dir != "":
					return Run(c.App.Writer, opts)
				}
				at := kube.AgentCAObjects{Namespace: c.String("namespace"), Secret: secret, ConfigMap: c.String("configmap")}
				if at.ConfigMap == "" {
					at.ConfigMap = secret
				}
				if at.Namespace == "" {
					ns, err := os.ReadFile(podNamespaceFile)
					if err != nil {
						return failure.PermanentError(nil, "--namespace is required outside a pod (%v)", err)
					}
					at.Namespace = string(ns)
				}
				clients, err := kube.NewClients(&config.Config{})
				if err != nil {
					return err
				}
				return RunInCluster(c.Context, c.App.Writer, clients, at, opts)
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
	if err := checkValidity(opts.Validity); err != nil {
		return err
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

// podNamespaceFile is where a pod finds its own namespace.
const podNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// RunInCluster makes the agent CA as a Secret and ConfigMap in the cluster when the Secret does
// not exist yet, and keeps the one there otherwise: the chart's pre-install and pre-upgrade hook
// runs it on every install and upgrade. The key goes from memory to the API server only.
func RunInCluster(ctx context.Context, out io.Writer, clients *kube.Clients, at kube.AgentCAObjects, opts Options) error {
	if err := checkValidity(opts.Validity); err != nil {
		return err
	}
	created, err := clients.EnsureAgentCA(ctx, at, func() ([]byte, []byte, error) { return agentca.Generate(opts.Name, opts.Validity) })
	if err != nil {
		return err
	}
	if created {
		fmt.Fprintf(out, "Agent CA made: Secret %s/%s (runners only), ConfigMap %s/%s (ca.crt).\n", at.Namespace, at.Secret, at.Namespace, at.ConfigMap)
	} else {
		fmt.Fprintf(out, "Agent CA kept: Secret %s/%s exists (rotation: docs/security.md#rotating-the-agent-ca).\n", at.Namespace, at.Secret)
	}
	return nil
}

func checkValidity(validity time.Duration) error {
	if validity < 24*time.Hour {
		return failure.PermanentError(nil, "--validity %s is too short: the CA must outlive the pods that trust it (at least 24h)", validity)
	}
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
