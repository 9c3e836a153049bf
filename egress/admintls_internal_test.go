package egress

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/egress/adminclient"
)

// testPKI writes a CA's certificate (ca.crt) and a serving certificate it signed for
// 127.0.0.1 (tls.crt, tls.key, named cn) into dir, and returns the CA's pool.
func testPKI(t *testing.T, dir, cn string) *x509.CertPool {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test egress admin CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for name, block := range map[string]*pem.Block{
		"ca.crt":  {Type: "CERTIFICATE", Bytes: caDER},
		"tls.crt": {Type: "CERTIFICATE", Bytes: der},
		"tls.key": {Type: "PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return pool
}

// serveAdmin serves b's admin API as the proxy does (TLS when configured) on loopback and
// returns its https:// address.
func serveAdmin(t *testing.T, b *Built) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: &Admin{Recorder: &Recorder{}, Grants: &Grants{}, Allow: b.Allow, Token: b.Token}, ErrorLog: log.New(io.Discard, "", 0)}
	go func() { _ = srv.Serve(tls.NewListener(ln, b.AdminTLS)) }()
	t.Cleanup(func() { srv.Close() })
	return "https://" + ln.Addr().String()
}

func loadTLSConfig(t *testing.T, dir, keys string) (*Built, error) {
	t.Helper()
	os.WriteFile(filepath.Join(dir, "token"), []byte("a-token-of-32-characters-or-so!!\n"), 0o600)
	p := filepath.Join(dir, "c.toml")
	os.WriteFile(p, []byte("allow = [\"x.example\"]\nadmin_token_file = \"token\"\n"+keys), 0o600)
	return LoadConfig(p)
}

// The admin API serves TLS 1.2 and 1.3 (1.3 to a client that has it) and nothing older, with the
// certificate of admin_tls_cert_file; the runner's client, trusting its CA, grants through it.
func TestAdminServesTLS12OrLater(t *testing.T) {
	dir := t.TempDir()
	ca := testPKI(t, dir, "proxy")
	b, err := loadTLSConfig(t, dir, "admin_allow = [\"10.0.0.0/8\", \"127.0.0.1\"]\nadmin_tls_cert_file = \"tls.crt\"\nadmin_tls_key_file = \"tls.key\"\n")
	if err != nil {
		t.Fatal(err)
	}
	base := serveAdmin(t, b)
	addr := strings.TrimPrefix(base, "https://")
	for _, tc := range []struct {
		max  uint16
		want uint16 // 0: refused
	}{
		{0, tls.VersionTLS13},
		{tls.VersionTLS12, tls.VersionTLS12},
		{tls.VersionTLS11, 0},
		{tls.VersionTLS10, 0},
	} {
		conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca, MinVersion: tls.VersionTLS10, MaxVersion: tc.max})
		switch {
		case tc.want == 0 && err == nil:
			t.Errorf("a client of at most %s: handshake succeeded with %s, want it refused", tls.VersionName(tc.max), tls.VersionName(conn.ConnectionState().Version))
		case tc.want != 0 && err != nil:
			t.Errorf("a client of at most %s: %v", tls.VersionName(tc.max), err)
		case tc.want != 0 && conn.ConnectionState().Version != tc.want:
			t.Errorf("a client of at most %s got %s, want %s", tls.VersionName(tc.max), tls.VersionName(conn.ConnectionState().Version), tls.VersionName(tc.want))
		}
		if conn != nil {
			conn.Close()
		}
	}
	client := &adminclient.Client{Base: base, Token: b.Token, CA: ca}
	if err := client.PutGrant(context.Background(), "10.88.0.5", adminclient.Grant{Allow: []string{"y.example"}, Until: time.Now().Add(time.Hour)}); err != nil {
		t.Errorf("a grant over TLS: %v", err)
	}
	if err := (&adminclient.Client{Base: base, Token: b.Token}).DeleteGrant(context.Background(), "10.88.0.5"); err == nil {
		t.Error("a client without the proxy's CA was not refused")
	}
}

// A renewed certificate (the Secret's files replaced) is served from the next handshake, without
// a restart; a broken pair keeps the last good one.
func TestAdminTLSReloadsTheCertificate(t *testing.T) {
	dir := t.TempDir()
	first := testPKI(t, dir, "first")
	b, err := loadTLSConfig(t, dir, "admin_tls_cert_file = \"tls.crt\"\nadmin_tls_key_file = \"tls.key\"\n")
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(serveAdmin(t, b), "https://")
	served := func(roots *x509.CertPool) (string, error) {
		conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots})
		if err != nil {
			return "", err
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
	}
	if cn, err := served(first); cn != "first" {
		t.Fatalf("served %q, %v; want the first certificate", cn, err)
	}
	time.Sleep(10 * time.Millisecond) // a modification time of its own
	second := testPKI(t, dir, "second")
	if cn, err := served(second); cn != "second" {
		t.Errorf("after renewal: served %q, %v; want the second certificate", cn, err)
	}
	os.WriteFile(filepath.Join(dir, "tls.key"), []byte("half-written"), 0o600)
	if cn, err := served(second); cn != "second" {
		t.Errorf("with a broken key file: served %q, %v; want the last good certificate", cn, err)
	}
}

// admin_allow beyond loopback needs the token and TLS; the TLS keys come in pairs and must load.
func TestAdminAllowBeyondLoopbackNeedsTLS(t *testing.T) {
	dir := t.TempDir()
	testPKI(t, dir, "proxy")
	for _, tc := range []struct{ keys, want string }{
		{"admin_allow = [\"10.99.2.1\"]\n", "admin_allow: 10.99.2.1/32 is not loopback: set admin_tls_cert_file and admin_tls_key_file"},
		{"admin_allow = [\"0.0.0.0/0\"]\nadmin_tls_cert_file = \"tls.crt\"\n", "set both or neither"},
		{"admin_tls_key_file = \"tls.key\"\n", "set both or neither"},
		{"admin_tls_cert_file = \"ca.crt\"\nadmin_tls_key_file = \"tls.key\"\n", "admin_tls_cert_file:"},
		{"admin_tls_cert_file = \"missing.crt\"\nadmin_tls_key_file = \"tls.key\"\n", "admin_tls_cert_file:"},
	} {
		if _, err := loadTLSConfig(t, dir, tc.keys); err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: %v, want one line with %q", tc.keys, err, tc.want)
		}
	}
	// Loopback may stay plain HTTP (the proxy's own pod, a host setup); TLS is allowed there too.
	for _, keys := range []string{"admin_allow = [\"127.0.0.1\"]\n", "admin_tls_cert_file = \"tls.crt\"\nadmin_tls_key_file = \"tls.key\"\n"} {
		if _, err := loadTLSConfig(t, dir, keys); err != nil {
			t.Errorf("%q: %v", keys, err)
		}
	}
}
