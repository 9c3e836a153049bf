// sandbox-egress-proxy is the egress proxy of proxied job pools: job pods may reach it and
// nothing else (NetworkPolicy), and it lets through only the destinations of its allowlist.
// Every decision is a JSON line on stdout; blocked attempts are served per client on the admin
// address (GET /v1/blocked?client=IP&since=RFC3339Nano), where the executor's run stage reads
// them into the job log. See docs/egress.md.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/sandbox-executor/sandbox-executor/buildinfo"
	"github.com/sandbox-executor/sandbox-executor/egress"
	"github.com/sandbox-executor/sandbox-executor/failure"
)

// Exit codes: 2 for a command line that cannot run, 1 for a failure while running.
const (
	exitFailure = 1
	exitUsage   = 2
)

func main() { os.Exit(proxyMain(os.Args, os.Stdout, os.Stderr)) }

// proxyMain runs the command line and returns the exit code.
func proxyMain(args []string, stdout, stderr io.Writer) int {
	code := 0
	fail := func(c int, err error) error {
		code = c
		fmt.Fprintln(stderr, "sandbox-egress-proxy:", failure.OneLine(err.Error()))
		return nil
	}
	app := &cli.App{
		Name:      "sandbox-egress-proxy",
		Usage:     "the egress proxy of proxied job pools: lets through only the destinations of its allowlist (docs/egress.md)",
		Version:   buildinfo.Version,
		Writer:    stdout,
		ErrWriter: stderr,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", Value: "/etc/sandbox-egress-proxy/config.toml", Usage: "TOML configuration file"},
			&cli.StringFlag{Name: "listen", Usage: "proxy address (overrides listen)"},
			&cli.StringFlag{Name: "admin-listen", Usage: "admin address (overrides admin_listen)"},
			&cli.BoolFlag{Name: "check", Usage: "validate the configuration and exit"},
		},
		// One line, not the whole help page, as in sandbox-executor.
		OnUsageError: func(_ *cli.Context, err error, _ bool) error {
			return fail(exitUsage, fmt.Errorf("%v: see sandbox-egress-proxy --help", err))
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return fail(exitUsage, fmt.Errorf("unexpected arguments %q: everything is a flag (see --help)", c.Args().Slice()))
			}
			err := run(c.String("config"), c.String("listen"), c.String("admin-listen"), c.Bool("check"), stdout, stderr)
			if err != nil {
				return fail(exitFailure, err)
			}
			return nil
		},
	}
	if err := app.Run(args); err != nil {
		fail(exitFailure, err)
	}
	return code
}

func run(configPath, listen, adminListen string, check bool, stdout, stderr io.Writer) error {
	cfg, err := egress.LoadConfig(configPath)
	if err != nil {
		return err
	}
	if listen != "" {
		cfg.Config.Listen = listen
	}
	if adminListen != "" {
		cfg.Config.AdminListen = adminListen
	}
	if check {
		fmt.Fprintf(stdout, "ok: %d rules: %s\n", len(cfg.Allowlist.Rules()), strings.Join(cfg.Allowlist.Rules(), ", "))
		return nil
	}
	rec := &egress.Recorder{PerClient: cfg.Config.PerClient, MaxClients: cfg.Config.MaxClients, Out: stdout}
	grants := &egress.Grants{}
	proxy := &egress.Proxy{Allowlist: cfg.Allowlist, Grants: grants, Hosts: cfg.Hosts, Recorder: rec,
		MaxTunnelsPerClient: cfg.Config.MaxTunnelsPerClient, TunnelIdleTimeout: cfg.TunnelIdleTimeout}
	admin := &egress.Admin{Recorder: rec, Grants: grants, Allow: cfg.Allow, Token: cfg.Token}

	proxyLn, err := net.Listen("tcp", cfg.Config.Listen)
	if err != nil {
		return err
	}
	adminLn, err := net.Listen("tcp", cfg.Config.AdminListen)
	if err != nil {
		return err
	}
	adminScheme := "http"
	if cfg.AdminTLS != nil {
		adminLn, adminScheme = tls.NewListener(adminLn, cfg.AdminTLS), "https"
	}
	servers := []*http.Server{
		{Handler: proxy, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute},
		{Handler: admin, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute},
	}
	errc := make(chan error, 2)
	for i, ln := range []net.Listener{proxyLn, adminLn} {
		go func() { errc <- servers[i].Serve(ln) }()
	}
	fmt.Fprintf(stderr, "sandbox-egress-proxy: proxy on %s, admin on %s://%s, %d allowlist rules: %s\n",
		proxyLn.Addr(), adminScheme, adminLn.Addr(), len(cfg.Allowlist.Rules()), strings.Join(cfg.Allowlist.Rules(), ", "))

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case s := <-sig:
		fmt.Fprintf(stderr, "sandbox-egress-proxy: %s, shutting down\n", s)
	case err = <-errc:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range servers {
		s.Shutdown(ctx)
	}
	proxy.Close()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
