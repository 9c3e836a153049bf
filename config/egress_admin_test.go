package config_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/config"
)

// egress_admin_token_file is checked at load: a missing, unreadable or short token fails the
// config with one line naming the key, not a stage later.
func TestEgressAdminTokenFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "token")
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(good, []byte("0123456789abcdef-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(short, []byte("too-short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	parse := func(file string) (*config.Config, error) {
		return config.Parse("c.toml", []byte("namespace = \"ns\"\negress_admin_token_file = \""+file+"\"\n[[pool]]\nname = \"p\"\n"))
	}
	cfg, err := parse(good)
	if err != nil {
		t.Fatal(err)
	}
	if token, err := cfg.EgressAdminToken(); err != nil || token != "0123456789abcdef-token" {
		t.Errorf("EgressAdminToken = %q, %v", token, err)
	}
	for file, want := range map[string]string{
		short:                         "egress_admin_token_file: " + short + ": the token must have at least 16 characters",
		filepath.Join(dir, "missing"): "egress_admin_token_file: open " + filepath.Join(dir, "missing"),
	} {
		if _, err := parse(file); err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: err = %v, want one line containing %q", file, err, want)
		}
	}
	unset, err := config.Parse("c.toml", []byte("namespace = \"ns\"\n[[pool]]\nname = \"p\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if token, err := unset.EgressAdminToken(); token != "" || err != nil {
		t.Errorf("without the key: %q, %v", token, err)
	}
}
