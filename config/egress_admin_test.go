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

// egress_admin_ca_file is checked at load too: a missing file, or one without a PEM
// certificate, fails the config with one line naming the key. Unset, the stages use the
// system's roots.
func TestEgressAdminCAFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "ca.crt")
	notPEM := filepath.Join(dir, "not-pem")
	if err := os.WriteFile(good, []byte(testCA), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(notPEM, []byte("a token, not a certificate\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	parse := func(keys string) (*config.Config, error) {
		return config.Parse("c.toml", []byte("namespace = \"ns\"\n"+keys+"\n[[pool]]\nname = \"p\"\negress_proxy = \"https://proxy.ns.svc:3129\"\n"))
	}
	cfg, err := parse("egress_admin_ca_file = \"" + good + "\"")
	if err != nil {
		t.Fatal(err)
	}
	if pool, err := cfg.EgressAdminCA(); err != nil || pool == nil {
		t.Errorf("EgressAdminCA = %v, %v", pool, err)
	}
	for keys, want := range map[string]string{
		"egress_admin_ca_file = \"" + notPEM + "\"":                        "egress_admin_ca_file: " + notPEM + " holds no PEM certificate",
		"egress_admin_ca_file = \"" + filepath.Join(dir, "missing") + "\"": "egress_admin_ca_file: open " + filepath.Join(dir, "missing"),
	} {
		if _, err := parse(keys); err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: err = %v, want one line containing %q", keys, err, want)
		}
	}
	unset, err := parse("")
	if err != nil {
		t.Fatal(err)
	}
	if pool, err := unset.EgressAdminCA(); pool != nil || err != nil {
		t.Errorf("without the key: %v, %v; want nil (the system's roots)", pool, err)
	}
}

// testCA is a CA certificate (deploy/local's egress admin CA: public).
const testCA = `-----BEGIN CERTIFICATE-----
MIIBvjCCAWSgAwIBAgIBATAKBggqhkjOPQQDAjBFMUMwQQYDVQQDEzpzYW5kYm94
LWV4ZWN1dG9yIGxvY2FsIGNsdXN0ZXIgZWdyZXNzIGFkbWluIENBICh0ZXN0IG9u
bHkpMB4XDTI2MTEyNzAwMDAwMFoXDTQ2MTEyNzAwMDAwMFowRTFDMEEGA1UEAxM6
c2FuZGJveC1leGVjdXRvciBsb2NhbCBjbHVzdGVyIGVncmVzcyBhZG1pbiBDQSAo
dGVzdCBvbmx5KTBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABGCMny/R5Qx7b0Kt
YS+6lWC+D/mB+EkFyLNkSqaOwlUOdn4kM5W1z5HlD6B9BHpEe2x4Vhk/8dZniAi4
9PPSSkmjRTBDMA4GA1UdDwEB/wQEAwICBDASBgNVHRMBAf8ECDAGAQH/AgEAMB0G
A1UdDgQWBBTFg585kfxFYUx+9a1f/sZ4ukBF/jAKBggqhkjOPQQDAgNIADBFAiEA
8RCRzBg7WrXe/NHwv2426bq9ZhywlvHtKtuHKQS+C/QCIB2ZHNMAMpeMX92v9skY
k1plCaSiJJbqZCB7F3w7pvrQ
-----END CERTIFICATE-----
`
