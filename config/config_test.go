package config_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/config"
)

func TestExampleConfigLoads(t *testing.T) {
	cfg, err := config.Load("../config.toml.example")
	if err != nil {
		t.Fatalf("the shipped example must load: %v", err)
	}
	if cfg.Namespace != "sandbox-executor" || cfg.DefaultPool != "duo-default" || cfg.ReadyTimeout.Duration != 2*time.Minute {
		t.Errorf("unexpected values: %+v", cfg)
	}
}

func TestDefaults(t *testing.T) {
	cfg, err := config.Parse("c.toml", []byte("namespace = \"ns\"\n[[pool]]\nname = \"p\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.UnknownImage != "reject" || strings.Join(cfg.RuntimeClasses, ",") != "gvisor" || cfg.BuildsDir != "/builds" || cfg.CacheDir != "/cache" {
		t.Errorf("defaults: %+v", cfg)
	}
	if cfg.RunnerName == "" || cfg.ClaimGrace.Duration <= 0 || cfg.CleanupTimeout.Duration <= 0 || cfg.Reconnects <= 0 {
		t.Errorf("defaults: %+v", cfg)
	}
}

// A key the file sets keeps its value, zero included: zero reconnects means never re-attach, and
// a zero timeout or an emptied default is refused in one line instead of becoming the default.
func TestExplicitZerosAreKeptOrRefused(t *testing.T) {
	const top, pool = "namespace = \"ns\"\n", "[[pool]]\nname = \"p\"\n"
	cfg, err := config.Parse("c.toml", []byte(top+"reconnects = 0\n"+pool))
	if err != nil || cfg.Reconnects != 0 {
		t.Errorf("reconnects = 0: %v, Reconnects %d, want 0 (never re-attach)", err, cfg.Reconnects)
	}
	for _, tc := range []struct{ line, want string }{
		{`ready_timeout = "0s"`, "ready_timeout: must be positive, got 0s"},
		{`claim_grace = "0s"`, "claim_grace: must be positive, got 0s"},
		{`cleanup_timeout = "0s"`, "cleanup_timeout: must be positive, got 0s"},
		{`builds_dir = ""`, `builds_dir: "" must be an absolute path`},
		{`drained_pool = ""`, `drained_pool: "" is not one of cold, wait`},
		{`unknown_image = ""`, `unknown_image: "" is not one of reject, cold`},
		{`runner_name = ""`, "runner_name: is required"},
		{"reconnects = -1", "reconnects: must not be negative"},
	} {
		_, err := config.Parse("c.toml", []byte(top+tc.line+"\n"+pool))
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one line containing %q", tc.line, err, tc.want)
		}
	}
}

func TestErrorsNameKeyAndFile(t *testing.T) {
	base := "namespace = \"ns\"\n"
	pool := "[[pool]]\nname = \"p\"\nimages = [\"ci:v1\"]\n"
	cold := base + "unknown_image = \"cold\"\n"
	for _, tc := range []struct{ name, text, key string }{
		{"unknown key", base + "namespcae = \"x\"\n" + pool, "namespcae: unknown key"},
		{"key after pool", base + pool + "default_pool = \"p\"\n", "top-level keys must come before"},
		{"missing namespace", pool, "namespace: is required"},
		{"bad namespace", "namespace = \"Bad_NS\"\n" + pool, "namespace:"},
		{"no pools", base, "pool: at least one"},
		{"unknown default pool", base + "default_pool = \"nope\"\n" + pool, "default_pool: \"nope\" is not one of"},
		{"bad policy", base + "unknown_image = \"allow\"\n" + pool, "unknown_image:"},
		{"empty runtime classes", base + "runtime_classes = []\n" + pool, "runtime_classes:"},
		{"relative builds dir", base + "builds_dir = \"builds\"\n" + pool, "builds_dir:"},
		{"bad duration", base + "ready_timeout = \"soon\"\n" + pool, "ready_timeout:"},
		{"wrong type", base + "reconnects = \"many\"\n" + pool, "reconnects"},
		{"pool image pattern", base + "[[pool]]\nname = \"p\"\nimages = [\"node:*\"]\n", `pool[0].images: "node:*" is a pattern: list the exact image the pool's template runs (e.g. node:<tag>), and set serve_other_tags = true`},
		{"pool image bad pattern", base + "[[pool]]\nname = \"p\"\nimages = [\"[\"]\n", `pool[0].images: "[" is a pattern`},
		{"pool image empty", base + "[[pool]]\nname = \"p\"\nimages = [\"\"]\n", `pool[0].images: "" is empty`},
		{"pool image with a space", base + "[[pool]]\nname = \"p\"\nimages = [\"node 22\"]\n", `pool[0].images: "node 22" has a space`},
		{"pool image without its tag", base + "[[pool]]\nname = \"p\"\nimages = [\"node:\"]\n", `pool[0].images: "node:" is not an image reference`},
		{"other tags of nothing", base + "[[pool]]\nname = \"p\"\nserve_other_tags = true\n", "pool[0].serve_other_tags: needs images"},
		{"duplicate pool", base + pool + pool, "listed twice"},
		{"egress proxy not a URL", base + pool + "egress_proxy = \"10.0.0.5:3129\"\n", "pool[0].egress_proxy: \"10.0.0.5:3129\" is not an http(s)://host:port URL"},
		{"egress proxy without host", base + pool + "egress_proxy = \"http:///v1\"\n", "pool[0].egress_proxy:"},
		{"egress proxy with credentials", base + pool + "egress_proxy = \"http://u:secret@10.0.0.5:3129\"\n", "pool[0].egress_proxy:"},
		{"egress grants without a proxy", base + pool + "egress_instance = true\n", "pool[0].egress_proxy: is required with egress_instance or egress_allow"},
		{"egress allow without a proxy", base + pool + "egress_allow = [\"registry.npmjs.org:443\"]\n", "pool[0].egress_proxy: is required"},
		{"egress wildcard alone", base + pool + "egress_proxy = \"http://10.0.0.5:3129\"\negress_instance_wildcard = true\n", "pool[0].egress_instance_wildcard: needs egress_instance = true"},
		{"egress allow empty entry", base + pool + "egress_proxy = \"http://10.0.0.5:3129\"\negress_allow = [\"\"]\n", "pool[0].egress_allow: has an empty entry"},
		{"cold without template", cold + "cold_images = [\"x:*\"]\n" + pool, "cold_template: is required with unknown_image = \"cold\""},
		{"cold without images", cold + "cold_template = \"t\"\n" + pool, "cold_images: is required with unknown_image = \"cold\""},
		{"cold bad template name", cold + "cold_template = \"Bad_T\"\ncold_images = [\"x:*\"]\n" + pool, "cold_template: \"Bad_T\" is not a valid"},
		{"cold bad pattern", cold + "cold_template = \"t\"\ncold_images = [\"[\"]\n" + pool, "cold_images: bad image pattern"},
		{"cold empty pattern", cold + "cold_template = \"t\"\ncold_images = [\"\"]\n" + pool, "cold_images: bad image pattern"},
		{"cold template without the policy", base + "cold_template = \"t\"\n" + pool, "cold_template: is only used with unknown_image = \"cold\""},
		{"cold images without the policy", base + "cold_images = [\"x:*\"]\n" + pool, "cold_images: is only used with unknown_image = \"cold\""},
		{"relative stage server", base + "stage_server = \"run/stages.sock\"\n" + pool, "stage_server: \"run/stages.sock\" must be an absolute path"},
		{"relative kubeconfig with a stage server", base + "stage_server = \"/run/s.sock\"\nkubeconfig = \"kube.yaml\"\n" + pool, "kubeconfig: \"kube.yaml\" must be an absolute path with stage_server set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse("/etc/se.toml", []byte(tc.text))
			if err == nil {
				t.Fatal("no error")
			}
			var cerr *config.Error
			if !errors.As(err, &cerr) || !strings.Contains(err.Error(), "/etc/se.toml") || !strings.Contains(err.Error(), tc.key) {
				t.Errorf("err = %v, want a config.Error naming the file and %q", err, tc.key)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("multi-line error: %q", err)
			}
		})
	}
}

func TestEgressProxyPerPool(t *testing.T) {
	cfg, err := config.Parse("c.toml", []byte("namespace = \"ns\"\n[[pool]]\nname = \"plain\"\n[[pool]]\nname = \"proxied\"\negress_proxy = \"http://10.99.2.2:3129\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p := cfg.Pool("proxied"); p == nil || p.EgressProxy != "http://10.99.2.2:3129" {
		t.Errorf("proxied pool: %+v", p)
	}
	if p := cfg.Pool("plain"); p == nil || p.EgressProxy != "" {
		t.Errorf("plain pool: %+v", p)
	}
	if p := cfg.Pool("nope"); p != nil {
		t.Errorf("unknown pool: %+v", p)
	}
}

func TestResolvePathAndMissingFile(t *testing.T) {
	env := func(v string) func(string) string { return func(string) string { return v } }
	if got := config.ResolvePath("/flag.toml", env("/env.toml")); got != "/flag.toml" {
		t.Errorf("flag should win, got %s", got)
	}
	if got := config.ResolvePath("", env("/env.toml")); got != "/env.toml" {
		t.Errorf("env should be used, got %s", got)
	}
	if got := config.ResolvePath("", env("")); got != config.DefaultPath {
		t.Errorf("default should be used, got %s", got)
	}
	missing := filepath.Join(t.TempDir(), "none.toml")
	if _, err := config.Load(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("Load(missing) = %v", err)
	}
	unreadable := t.TempDir()
	if _, err := config.Load(unreadable); err == nil {
		t.Error("loading a directory should fail")
	}
}

func TestHelperBinary(t *testing.T) {
	dir := t.TempDir()
	executable := filepath.Join(dir, "gitlab-runner")
	plain := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(executable, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(plain, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	parse := func(helper string) (*config.Config, error) {
		return config.Parse("/etc/se.toml", []byte(fmt.Sprintf("namespace = \"ns\"\nhelper_binary = %q\n[[pool]]\nname = \"p\"\n", helper)))
	}
	cfg, err := parse(executable)
	if err != nil || cfg.HelperBinary != executable {
		t.Fatalf("an executable file: %v, %+v", err, cfg)
	}
	if cfg, err := parse(""); err != nil || cfg.HelperBinary != "" {
		t.Errorf("empty (off): %v, %q", err, cfg.HelperBinary)
	}
	for _, tc := range []struct{ helper, want string }{
		{filepath.Join(dir, "missing"), "does not exist"},
		{dir, "is not a regular file"},
		{plain, "is not executable"},
		{"gitlab-runner", "must be an absolute path"},
	} {
		_, err := parse(tc.helper)
		var cerr *config.Error
		if !errors.As(err, &cerr) || cerr.Key != "helper_binary" || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("helper_binary = %q: %v; want a one-line helper_binary error with %q", tc.helper, err, tc.want)
		}
	}
}

// The network transport is TLS with the agent CA: without one, the default is exec, and asking
// for network is a one-line error naming what to set.
func TestNetworkTransportNeedsTheAgentCA(t *testing.T) {
	base := "namespace = \"ns\"\n[[pool]]\nname = \"p\"\n"
	cfg, err := config.Parse("c.toml", []byte(base))
	if err != nil || cfg.StageTransport != config.TransportExec {
		t.Fatalf("without an agent CA: %v, %v; want exec", cfg, err)
	}
	_, err = config.Parse("c.toml", []byte("stage_transport = \"network\"\n"+base))
	if err == nil || !strings.Contains(err.Error(), "agent_ca_cert") || strings.Contains(err.Error(), "\n") {
		t.Errorf("network without an agent CA: %v; want one line naming agent_ca_cert", err)
	}
	_, err = config.Parse("c.toml", []byte("agent_ca_cert = \"/etc/ca.crt\"\n"+base))
	if err == nil || !strings.Contains(err.Error(), "go together") {
		t.Errorf("a certificate without its key: %v", err)
	}
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	for _, f := range []string{cert, key} {
		if err := os.WriteFile(f, []byte("pem"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err = config.Parse("c.toml", []byte(fmt.Sprintf("agent_ca_cert = %q\nagent_ca_key = %q\n", cert, key)+base))
	if err != nil || cfg.StageTransport != config.TransportNetwork {
		t.Errorf("with an agent CA: %v, %v; want network by default", cfg, err)
	}
	_, err = config.Parse("c.toml", []byte(fmt.Sprintf("agent_ca_cert = %q\nagent_ca_key = %q\n", cert, filepath.Join(dir, "missing"))+base))
	if err == nil || !strings.Contains(err.Error(), "agent_ca_key") {
		t.Errorf("a missing key file: %v", err)
	}
}
