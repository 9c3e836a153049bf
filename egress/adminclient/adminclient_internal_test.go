package adminclient

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// The client sends the token when it has one, and a refusal is a RefusedError: the call made
// nothing.
func TestClientSendsTheBearerToken(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("Authorization"))
		if r.Header.Get("Authorization") == "" {
			http.Error(w, "egress proxy admin: forbidden", http.StatusForbidden)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	ctx := context.Background()
	withToken := &Client{Base: srv.URL, Token: "a-token-of-32-characters-or-so!!"}
	if err := withToken.PutGrant(ctx, "10.88.0.5", Grant{Allow: []string{"x.example"}, Until: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	err := (&Client{Base: srv.URL}).DeleteGrant(ctx, "10.88.0.5")
	var refused *RefusedError
	if !errors.As(err, &refused) || err.Error() != "403 Forbidden: egress proxy admin: forbidden" {
		t.Errorf("without a token: %v, want a RefusedError", err)
	}
	if len(got) != 2 || got[0] != "Bearer a-token-of-32-characters-or-so!!" || got[1] != "" {
		t.Errorf("Authorization headers sent: %q", got)
	}
}

// Over https the client verifies the proxy's certificate against CA: a proxy whose certificate
// another CA signed (or no CA given, and a private one) gets no request, so no token.
func TestClientRefusesAServerOfAnotherCA(t *testing.T) {
	var calls int
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	otherCA := x509.NewCertPool()
	otherCA.AddCert(anotherCA(t))
	ctx := context.Background()
	for name, c := range map[string]*Client{
		"another CA":   {Base: srv.URL, Token: "a-token-of-32-characters-or-so!!", CA: otherCA},
		"system roots": {Base: srv.URL, Token: "a-token-of-32-characters-or-so!!"},
	} {
		err := c.DeleteGrant(ctx, "10.88.0.5")
		var unknown x509.UnknownAuthorityError
		if !errors.As(err, &unknown) {
			t.Errorf("%s: %v, want the proxy's certificate refused (unknown authority)", name, err)
		}
	}
	if calls != 0 {
		t.Fatalf("the proxy got %d requests from clients that should have refused it", calls)
	}
	ca := x509.NewCertPool()
	ca.AddCert(srv.Certificate())
	if err := (&Client{Base: srv.URL, Token: "a-token-of-32-characters-or-so!!", CA: ca}).DeleteGrant(ctx, "10.88.0.5"); err != nil || calls != 1 {
		t.Errorf("with the proxy's CA: %v after %d calls, want success", err, calls)
	}
}

// The client speaks TLS 1.2 or later: a proxy offering at most TLS 1.1 is refused.
func TestClientRefusesTLSBelow12(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	srv.TLS = &tls.Config{MaxVersion: tls.VersionTLS11}
	srv.StartTLS()
	defer srv.Close()
	ca := x509.NewCertPool()
	ca.AddCert(srv.Certificate())
	if err := (&Client{Base: srv.URL, CA: ca}).DeleteGrant(context.Background(), "10.88.0.5"); err == nil || !strings.Contains(err.Error(), "protocol version") {
		t.Errorf("a TLS 1.1 proxy: %v, want a protocol version error", err)
	}
}

// anotherCA is a CA certificate of its own key, for localhost too: not the one httptest's
// servers are signed with.
func anotherCA(t *testing.T) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "another CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}
