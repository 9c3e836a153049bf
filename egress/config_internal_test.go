package egress

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The local cluster's configuration loads (the chart's is tested in tests/chart).
func TestLocalConfigLoads(t *testing.T) {
	b, err := LoadConfig("../deploy/local/egress-proxy.toml")
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Allowlist.Rules()) == 0 || len(b.Allow) == 0 {
		t.Errorf("no allowlist: %+v", b)
	}
	if b.Hosts["gitlab.sandbox.test"].String() != "10.99.1.2" || b.Config.Listen != "10.99.2.2:3128" {
		t.Errorf("local config: %+v", b)
	}
}

func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short-token")
	os.WriteFile(short, []byte("tooshort\n"), 0o600)
	for _, c := range []struct{ text, want string }{
		{`allow = []`, "allow: the allowlist is empty"},
		{`allow = ["*"]`, `allow: allowlist entry "*"`},
		{`alow = ["x.example"]`, "alow: unknown key"},
		{"allow = [\"x.example\"]\n[hosts]\n\"x.example\" = \"not-an-ip\"", "hosts: x.example = \"not-an-ip\" is not an IP address"},
		{"allow = [\"x.example\"]\nadmin_allow = [\"10.0.0.0/33\"]", "admin_allow: \"10.0.0.0/33\""},
		{"allow = [\"x.example\"]\nlisten = \"3128\"", `listen: "3128" is not host:port`},
		{"allow = [\"x.example\"]\nadmin_token_file = \"" + short + "\"", "at least 16 characters"},
		{"allow = [\"x.example\"]\nadmin_token_file = \"" + filepath.Join(dir, "missing") + "\"", "admin_token_file:"},
		{"allow = [\"x.example\"]\nmax_tunnels_per_client = -1", "max_tunnels_per_client must not be negative"},
		{"allow = [\"x.example\"]\ntunnel_idle_timeout = \"ten minutes\"", `tunnel_idle_timeout: "ten minutes" is not a positive duration`},
		{"allow = [\"x.example\"]\ntunnel_idle_timeout = \"0s\"", "tunnel_idle_timeout:"},
	} {
		p := filepath.Join(dir, "c.toml")
		os.WriteFile(p, []byte(c.text), 0o600)
		if _, err := LoadConfig(p); err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), p) {
			t.Errorf("%q: %v, want an error naming the file and %q", c.text, err, c.want)
		}
	}
	p := filepath.Join(dir, "ok.toml")
	os.WriteFile(p, []byte("allow = [\"x.example\"]\nadmin_allow = [\"127.0.0.1\"]\n"), 0o600)
	b, err := LoadConfig(p)
	if err != nil || len(b.Allow) != 1 || b.Allow[0].String() != "127.0.0.1/32" || b.Config.Listen != ":3128" || b.Config.AdminListen != "127.0.0.1:3129" || b.TunnelIdleTimeout != DefaultTunnelIdleTimeout {
		t.Errorf("defaults: %+v %v", b, err)
	}
	os.WriteFile(p, []byte("allow = [\"x.example\"]\nmax_tunnels_per_client = 32\ntunnel_idle_timeout = \"90s\"\n"), 0o600)
	if b, err := LoadConfig(p); err != nil || b.Config.MaxTunnelsPerClient != 32 || b.TunnelIdleTimeout != 90*time.Second {
		t.Errorf("tunnel bounds: %+v %v", b, err)
	}
}

// The admin API widens pods' egress: a network other than loopback in admin_allow needs the
// token (and TLS: TestAdminAllowBeyondLoopbackNeedsTLS), or the proxy does not start. Relative
// files are the config file's neighbours.
func TestAdminAllowBeyondLoopbackNeedsAToken(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "token"), []byte("a-token-of-32-characters-or-so!!\n"), 0o600)
	testPKI(t, dir, "proxy")
	load := func(keys string) (*Built, error) {
		p := filepath.Join(dir, "c.toml")
		os.WriteFile(p, []byte("allow = [\"x.example\"]\n"+keys), 0o600)
		return LoadConfig(p)
	}
	for _, allow := range []string{`["0.0.0.0/0", "::/0"]`, `["10.99.2.1"]`, `["127.0.0.0/7"]`, `["::/127"]`, `["::ffff:127.0.0.0/104"]`} {
		_, err := load("admin_allow = " + allow + "\n")
		if err == nil || !strings.Contains(err.Error(), "is not loopback: set admin_token_file") || strings.Contains(err.Error(), "\n") {
			t.Errorf("admin_allow = %s without a token: %v, want one line asking for admin_token_file", allow, err)
		}
		b, err := load("admin_allow = " + allow + "\nadmin_token_file = \"token\"\nadmin_tls_cert_file = \"tls.crt\"\nadmin_tls_key_file = \"tls.key\"\n")
		if err != nil || b.Token != "a-token-of-32-characters-or-so!!" || b.AdminTLS == nil {
			t.Errorf("admin_allow = %s with a token: %+v, %v", allow, b, err)
		}
	}
	for _, allow := range []string{`["127.0.0.1"]`, `["127.0.0.0/8", "::1"]`} {
		if _, err := load("admin_allow = " + allow + "\n"); err != nil {
			t.Errorf("admin_allow = %s (loopback) without a token: %v", allow, err)
		}
	}
	if _, err := load(""); err != nil {
		t.Errorf("the default admin_allow (loopback) without a token: %v", err)
	}
}
