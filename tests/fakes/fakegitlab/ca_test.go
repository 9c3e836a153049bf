package fakegitlab_test

import (
	"crypto/tls"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakegitlab"
)

// WithTLS serves the API over HTTPS with a certificate of the instance's CA: a client that trusts
// the CA registers, one that does not is refused by its own TLS check.
func TestWithTLSServesHTTPSWithTheInstanceCA(t *testing.T) {
	ca, err := fakegitlab.NewCA("instance CA")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.ServerCert("127.0.0.1", "gitlab.internal.test")
	if err != nil {
		t.Fatal(err)
	}
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	server := fakegitlab.New(fakegitlab.WithListener(listener), fakegitlab.WithTLS(cert))
	defer server.Close()
	if !strings.HasPrefix(server.URL(), "https://127.0.0.1:") {
		t.Fatalf("URL %s, want https://127.0.0.1:PORT", server.URL())
	}
	verify := func(client *http.Client) (int, error) {
		res, err := client.Post(server.URL()+"/api/v4/runners/verify", "application/json",
			strings.NewReader(`{"token":"`+fakegitlab.DefaultRunnerToken+`"}`))
		if err != nil {
			return 0, err
		}
		res.Body.Close()
		return res.StatusCode, nil
	}
	trusting := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	if code, err := verify(trusting); err != nil || code != http.StatusOK {
		t.Errorf("a client trusting the CA: %d, %v; want 200", code, err)
	}
	if _, err := verify(&http.Client{}); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a client without the CA: %v, want a certificate error", err)
	}
}
