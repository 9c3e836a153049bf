package agentca_test

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/agentca"
)

// A stage's client certificate names its job, is signed by the CA, is a client certificate
// only, and expires no later than the CA.
func TestClientCertificateNamesTheJob(t *testing.T) {
	ca, err := agentca.New("test", 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	config, err := ca.ClientConfig("v1:binding", wire.IdentityOf([]byte("agent key")))
	if err != nil {
		t.Fatal(err)
	}
	chain := config.Certificates[0].Certificate
	leaf, err := x509.ParseCertificate(chain[0])
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertificatePEM())
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("the client certificate does not verify against the CA: %v", err)
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != wire.JobURIPrefix+"v1:binding" {
		t.Errorf("URIs %v, want the job's", leaf.URIs)
	}
	if leaf.IsCA || leaf.NotAfter.After(ca.NotAfter()) {
		t.Errorf("IsCA %t, NotAfter %s (CA's %s)", leaf.IsCA, leaf.NotAfter, ca.NotAfter())
	}
	if _, err := ca.ClientConfig("v1:binding", "sha256:short"); err == nil {
		t.Error("an identity that is no SHA-256 was accepted for pinning")
	}
}

// A job whose certificate URI would read back as another job is refused: "x#" reads as "x", "# "
// as "#%20", as the jobs "x" and "#%20" do, and the agent would take two jobs for one (found by
// the agent's FuzzJobOf). Bindings ("v1:" and hex) read back as themselves.
func TestClientConfigRefusesAJobItsURIWouldChange(t *testing.T) {
	ca, err := agentca.New("test", 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	identity := wire.IdentityOf([]byte("agent key"))
	for _, job := range []string{"# ", "a#b c", "x#", "#a#b"} {
		if _, err := ca.ClientConfig(job, identity); err == nil || !strings.Contains(err.Error(), "would read back as") || strings.Contains(err.Error(), "\n") {
			t.Errorf("ClientConfig(%q) = %v; want a one-line refusal", job, err)
		}
	}
	for _, job := range []string{"v1:" + strings.Repeat("0f", 32), "#%20", "x"} {
		if _, err := ca.ClientConfig(job, identity); err != nil {
			t.Errorf("ClientConfig(%q): %v", job, err)
		}
	}
}

// A certificate that is not a CA's, or a key that does not match, is refused with one line.
func TestParseRefusesWhatIsNotACA(t *testing.T) {
	certPEM, keyPEM, err := agentca.Generate("a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	_, otherKey, err := agentca.Generate("b", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := agentca.Parse(certPEM, otherKey); err == nil || strings.Contains(err.Error(), "\n") {
		t.Errorf("a key of another CA: %v; want one line", err)
	}
	if _, err := agentca.Parse(certPEM, keyPEM); err != nil {
		t.Errorf("its own key: %v", err)
	}
}

// Whoever reads the CA's key mints client certificates for any job: Load refuses a key file
// other users can read, naming the fix.
func TestLoadRefusesAKeyOthersCanRead(t *testing.T) {
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca.key")
	if err := writeCA(cert, key); err != nil {
		t.Fatal(err)
	}
	for mode, wantErr := range map[os.FileMode]bool{0o600: false, 0o400: false, 0o640: false, 0o604: true, 0o644: true, 0o666: true} {
		if err := os.Chmod(key, mode); err != nil {
			t.Fatal(err)
		}
		_, err := agentca.Load(cert, key)
		if wantErr != (err != nil) {
			t.Errorf("a key of mode %04o: Load = %v; want refused %t", mode, err, wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), "chmod 600 "+key) {
			t.Errorf("the refusal does not name the fix: %v", err)
		}
	}
	// Group access only for the process's own group (the chart's fsGroup): another group's
	// members are other users.
	other := os.Getegid() + 1
	if err := os.Chmod(key, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(key, -1, other); err != nil {
		t.Skipf("cannot give the key another group (%v)", err)
	}
	if _, err := agentca.Load(cert, key); err == nil {
		t.Errorf("a key readable by group %d, not this process's, was loaded", other)
	}
}

func writeCA(certFile, keyFile string) error {
	certPEM, keyPEM, err := agentca.Generate("test", time.Hour)
	if err != nil {
		return err
	}
	if err := os.WriteFile(certFile, certPEM, 0o644); err != nil {
		return err
	}
	return os.WriteFile(keyFile, keyPEM, 0o600)
}
