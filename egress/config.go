package egress

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/sandbox-executor/sandbox-executor/egress/allowlist"
)

// Config is the proxy's TOML configuration (cmd/sandbox-egress-proxy).
type Config struct {
	// Listen is the proxy's address (HTTP_PROXY/HTTPS_PROXY of the job pods).
	Listen string `toml:"listen"`
	// AdminListen serves GET /v1/blocked and /healthz.
	AdminListen string `toml:"admin_listen"`
	// AdminAllow lists the networks that may call the admin API (default: loopback). Sources
	// other than loopback must also send the token of AdminTokenFile, which is therefore
	// required when AdminAllow names any other network.
	AdminAllow []string `toml:"admin_allow"`
	// AdminTokenFile holds the admin API's bearer token (relative: to the config file's
	// directory).
	AdminTokenFile string `toml:"admin_token_file"`
	// AdminTLSCertFile and AdminTLSKeyFile serve the admin API over TLS (1.2 or later, 1.3
	// preferred) with this certificate and key (PEM; relative: to the config file's directory),
	// read again when either file changes. Required, with AdminTokenFile, when AdminAllow names
	// any network beyond loopback: the token must not cross a network in clear.
	AdminTLSCertFile string `toml:"admin_tls_cert_file"`
	AdminTLSKeyFile  string `toml:"admin_tls_key_file"`
	// Allow is the allowlist (see allowlist.Rule).
	Allow []string `toml:"allow"`
	// Instance are the entries of the GitLab instance the runners are registered with: like
	// Allow's, but their names may resolve to private addresses (an on-premises instance, whose
	// name the admin chose), which Allow's may not.
	Instance []string `toml:"instance"`
	// Hosts resolves names without DNS: name = "IP".
	Hosts map[string]string `toml:"hosts"`
	// PerClient and MaxClients bound the blocked attempts kept in memory.
	PerClient  int `toml:"per_client"`
	MaxClients int `toml:"max_clients"`
	// MaxTunnelsPerClient bounds the CONNECT tunnels and forwarded requests one pod holds open
	// (default 256).
	MaxTunnelsPerClient int `toml:"max_tunnels_per_client"`
	// TunnelIdleTimeout closes a tunnel or forwarded request idle both ways for that long
	// (default "10m").
	TunnelIdleTimeout string `toml:"tunnel_idle_timeout"`
}

// Built is a validated configuration, ready to serve.
type Built struct {
	Config    Config
	Allowlist *allowlist.Allowlist
	Hosts     map[string]netip.Addr
	Allow     []netip.Prefix
	Token     string
	// AdminTLS serves the admin API when admin_tls_cert_file is set; nil: plain HTTP (loopback
	// only).
	AdminTLS *tls.Config
	// TunnelIdleTimeout is tunnel_idle_timeout parsed.
	TunnelIdleTimeout time.Duration
}

// LoadConfig reads and validates a config file.
func LoadConfig(path string) (*Built, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %v", err)
	}
	return ParseConfig(path, data)
}

// ParseConfig validates the config file path's contents data.
func ParseConfig(path string, data []byte) (*Built, error) {
	var c Config
	md, err := toml.Decode(string(data), &c)
	if err != nil {
		return nil, fmt.Errorf("config %s: %v", path, err)
	}
	for _, f := range []*string{&c.AdminTokenFile, &c.AdminTLSCertFile, &c.AdminTLSKeyFile} {
		if *f != "" && !filepath.IsAbs(*f) {
			*f = filepath.Join(filepath.Dir(path), *f)
		}
	}
	if u := md.Undecoded(); len(u) > 0 {
		return nil, fmt.Errorf("config %s: %s: unknown key", path, u[0])
	}
	b, err := c.Build()
	if err != nil {
		return nil, fmt.Errorf("config %s: %v", path, err)
	}
	return b, nil
}

// Build applies defaults and validates.
func (c Config) Build() (*Built, error) {
	if c.Listen == "" {
		c.Listen = ":3128"
	}
	if c.AdminListen == "" {
		c.AdminListen = "127.0.0.1:3129"
	}
	for key, addr := range map[string]string{"listen": c.Listen, "admin_listen": c.AdminListen} {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("%s: %q is not host:port", key, addr)
		}
	}
	if c.PerClient < 0 || c.MaxClients < 0 {
		return nil, fmt.Errorf("per_client and max_clients must not be negative")
	}
	if c.MaxTunnelsPerClient < 0 {
		return nil, fmt.Errorf("max_tunnels_per_client must not be negative (0: %d)", DefaultMaxTunnelsPerClient)
	}
	idle := DefaultTunnelIdleTimeout
	if c.TunnelIdleTimeout != "" {
		d, err := time.ParseDuration(c.TunnelIdleTimeout)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("tunnel_idle_timeout: %q is not a positive duration such as \"10m\"", c.TunnelIdleTimeout)
		}
		idle = d
	}
	if len(c.Allow)+len(c.Instance) == 0 {
		return nil, fmt.Errorf("allow: the allowlist is empty: every destination would be blocked")
	}
	b := &Built{Config: c, Hosts: map[string]netip.Addr{}, TunnelIdleTimeout: idle}
	var err error
	if b.Allowlist, err = allowlist.ParseAllowlist(c.Allow); err != nil {
		return nil, fmt.Errorf("allow: %v", err)
	}
	instance, err := allowlist.ParseAllowlist(c.Instance)
	if err != nil {
		return nil, fmt.Errorf("instance: %v", err)
	}
	b.Allowlist = b.Allowlist.With(instance.Private())
	for name, ip := range c.Hosts {
		n, err := allowlist.NormalizeName(name)
		if err != nil {
			return nil, fmt.Errorf("hosts: %v", err)
		}
		a, err := netip.ParseAddr(ip)
		if err != nil {
			return nil, fmt.Errorf("hosts: %s = %q is not an IP address", name, ip)
		}
		b.Hosts[n] = a.Unmap()
	}
	if c.AdminAllow == nil {
		b.Allow = DefaultAdminAllow
	}
	for _, s := range c.AdminAllow {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, fmt.Errorf("admin_allow: %q is neither a CIDR nor an IP address", s)
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		b.Allow = append(b.Allow, p.Masked())
	}
	if i := slices.IndexFunc(b.Allow, func(p netip.Prefix) bool { return !isLoopback(p) }); i >= 0 {
		switch {
		case c.AdminTokenFile == "":
			return nil, fmt.Errorf("admin_allow: %s is not loopback: set admin_token_file (a bearer token of 16 or more characters), which sources outside loopback must send", b.Allow[i])
		case c.AdminTLSCertFile == "":
			return nil, fmt.Errorf("admin_allow: %s is not loopback: set admin_tls_cert_file and admin_tls_key_file, so that the admin token does not cross the network in clear", b.Allow[i])
		}
	}
	if (c.AdminTLSCertFile == "") != (c.AdminTLSKeyFile == "") {
		return nil, fmt.Errorf("admin_tls_cert_file and admin_tls_key_file: set both or neither")
	}
	if c.AdminTLSCertFile != "" {
		if b.AdminTLS, err = adminTLS(c.AdminTLSCertFile, c.AdminTLSKeyFile); err != nil {
			return nil, fmt.Errorf("admin_tls_cert_file: %v", err)
		}
	}
	if c.AdminTokenFile != "" {
		t, err := os.ReadFile(c.AdminTokenFile)
		if err != nil {
			return nil, fmt.Errorf("admin_token_file: %v", err)
		}
		if b.Token = strings.TrimSpace(string(t)); len(b.Token) < 16 {
			return nil, fmt.Errorf("admin_token_file %s: the token must have at least 16 characters", c.AdminTokenFile)
		}
	}
	return b, nil
}

// loopbackV4 is IPv4's loopback network.
var loopbackV4 = netip.MustParsePrefix("127.0.0.0/8")

// isLoopback tells whether every address of p is this machine's.
func isLoopback(p netip.Prefix) bool {
	return p.Addr().Is4() && p.Bits() >= loopbackV4.Bits() && loopbackV4.Contains(p.Addr()) ||
		p.Addr() == netip.IPv6Loopback() && p.Bits() == 128
}

// adminTLS serves the admin API with the key pair of certFile and keyFile: TLS 1.2 or later
// (Go negotiates 1.3 with every client that has it, and offers only AEAD ECDHE suites below
// it). The pair is read again on a handshake after either file's modification time or size
// changed (a renewed Secret), and kept when the new pair does not load.
func adminTLS(certFile, keyFile string) (*tls.Config, error) {
	k := &keyPair{certFile: certFile, keyFile: keyFile}
	if err := k.load(); err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return k.get(), nil
		},
	}, nil
}

// keyPair is a certificate and key loaded from files, reloaded when they change.
type keyPair struct {
	certFile, keyFile string
	mu                sync.Mutex
	cert              *tls.Certificate
	stamp             string
}

func (k *keyPair) fileStamp() string {
	var b strings.Builder
	for _, f := range []string{k.certFile, k.keyFile} {
		if fi, err := os.Stat(f); err == nil {
			fmt.Fprintf(&b, "%d/%d;", fi.ModTime().UnixNano(), fi.Size())
		}
	}
	return b.String()
}

func (k *keyPair) load() error {
	stamp := k.fileStamp()
	cert, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	if err != nil {
		return err
	}
	k.cert, k.stamp = &cert, stamp
	return nil
}

func (k *keyPair) get() *tls.Certificate {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.fileStamp() != k.stamp {
		_ = k.load() // a half-written pair keeps the last good one
	}
	return k.cert
}
