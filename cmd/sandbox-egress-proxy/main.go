// sandbox-egress-proxy is the egress proxy of proxied job pools: job pods may reach it and
// nothing else (NetworkPolicy), and it lets through only the destinations of its allowlist.
// Every decision is a JSON line on stdout; blocked attempts are served per client on the admin
// address (GET /v1/blocked?client=IP&since=RFC3339Nano), where the executor's run stage reads
// them into the job log. See docs/egress.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/sandbox-executor/sandbox-executor/egress"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox-egress-proxy:", err)
		os.Exit(1)
	}
}

func run() error {
	configPath := flag.String("config", "/etc/sandbox-egress-proxy/config.toml", "TOML configuration file")
	listen := flag.String("listen", "", "proxy address (overrides listen)")
	adminListen := flag.String("admin-listen", "", "admin address (overrides admin_listen)")
	check := flag.Bool("check", false, "validate the configuration and exit")
	flag.Parse()
	cfg, err := egress.LoadConfig(*configPath)
	if err != nil {
		return err
	}
	if *listen != "" {
		cfg.Config.Listen = *listen
	}
	if *adminListen != "" {
		cfg.Config.AdminListen = *adminListen
	}
	if *check {
		fmt.Printf("ok: %d rules: %s\n", len(cfg.Allowlist.Rules()), strings.Join(cfg.Allowlist.Rules(), ", "))
		return nil
	}
	rec := &egress.Recorder{PerClient: cfg.Config.PerClient, MaxClients: cfg.Config.MaxClients, Out: os.Stdout}
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
	servers := []*http.Server{
		{Handler: proxy, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute},
		{Handler: admin, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute},
	}
	errc := make(chan error, 2)
	for i, ln := range []net.Listener{proxyLn, adminLn} {
		go func() { errc <- servers[i].Serve(ln) }()
	}
	fmt.Fprintf(os.Stderr, "sandbox-egress-proxy: proxy on %s, admin on %s, %d allowlist rules: %s\n",
		proxyLn.Addr(), adminLn.Addr(), len(cfg.Allowlist.Rules()), strings.Join(cfg.Allowlist.Rules(), ", "))

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case s := <-sig:
		fmt.Fprintf(os.Stderr, "sandbox-egress-proxy: %s, shutting down\n", s)
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
