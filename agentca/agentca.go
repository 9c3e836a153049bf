// Package agentca is the installation's agent CA: the key the executor proves itself to the
// stage agent in a job pod with. Its certificate goes into the pods (through the SandboxTemplate)
// and its key stays with the runners; for each stage process the executor mints a short-lived
// client certificate naming the job, and pins the agent's own key. Standard library only.
package agentca

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
)

// CA signs the executor's client certificates.
type CA struct {
	cert *x509.Certificate
	key  crypto.Signer
}

// clientValidity bounds a stage process's certificate: it is checked at each (re)connection of
// the stage, so it must outlive the longest stage; it is held in memory only.
const clientValidity = 7 * 24 * time.Hour

// Generate makes a new CA (ECDSA P-256, valid for years; rotate it as docs/security.md says) and
// returns its certificate and key, PEM.
func Generate(name string, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	template := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// New makes a new CA, as Generate does, ready to sign.
func New(name string, validity time.Duration) (*CA, error) {
	certPEM, keyPEM, err := Generate(name, validity)
	if err != nil {
		return nil, err
	}
	return Parse(certPEM, keyPEM)
}

// Load reads a CA's certificate and key files (PEM; the key PKCS#8, SEC 1 or PKCS#1, as
// openssl, cert-manager and Generate write them).
func Load(certFile, keyFile string) (*CA, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, err
	}
	if err := checkKeyMode(keyFile); err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, err
	}
	return Parse(certPEM, keyPEM)
}

// checkKeyMode refuses a key file others can read: whoever reads it can mint a client
// certificate for any job. Group access passes only for the process's own group: the chart
// mounts the key 0440 for the runner pod's group (fsGroup, runAsGroup), which no one else has.
func checkKeyMode(keyFile string) error {
	info, err := os.Stat(keyFile)
	if err != nil {
		return err
	}
	perm := info.Mode().Perm()
	ownGroup := false
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		ownGroup = int(st.Gid) == os.Getegid()
	}
	if perm&0o007 != 0 || perm&0o070 != 0 && !ownGroup {
		return fmt.Errorf("the agent CA's key %s is open to other users (mode %04o): chmod 600 %s", keyFile, perm, keyFile)
	}
	return nil
}

// Parse reads a CA from PEM.
func Parse(certPEM, keyPEM []byte) (*CA, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("the agent CA's certificate and key: %w", err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, errors.New("the agent CA's certificate is not a CA certificate (basicConstraints CA:TRUE, keyUsage keyCertSign)")
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, errors.New("the agent CA's key cannot sign")
	}
	return &CA{cert: cert, key: signer}, nil
}

// CertificatePEM is what pods trust (wire.ClientCAEnv).
func (c *CA) CertificatePEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.cert.Raw})
}

// NotAfter is when the CA stops signing usable certificates.
func (c *CA) NotAfter() time.Time { return c.cert.NotAfter }

// ClientConfig is the TLS configuration of one stage process talking to the agent of job's pod:
// a fresh client key and certificate for job (its binding), and the agent's key pinned to
// identity (wire.IdentityOf), which the executor learnt over the API server, not the network.
func (c *CA) ClientConfig(job, identity string) (*tls.Config, error) {
	if job == "" || !wire.ValidIdentity(identity) {
		return nil, fmt.Errorf("agent TLS needs the job and the agent's identity (got %q)", identity)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	uri, err := url.Parse(wire.JobURIPrefix + job)
	if err != nil {
		return nil, err
	}
	if back, _ := strings.CutPrefix(uri.String(), wire.JobURIPrefix); back != job {
		return nil, fmt.Errorf("agent TLS: job %q would read back as %q from its certificate's URI", job, back)
	}
	now := time.Now()
	notAfter := now.Add(clientValidity)
	if notAfter.After(c.cert.NotAfter) {
		notAfter = c.cert.NotAfter
	}
	template := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "sandbox-executor"},
		URIs:         []*url.URL{uri},
		NotBefore:    now.Add(-5 * time.Minute), // the pod's clock may lag the runner's a little
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, template, c.cert, &key.PublicKey, c.key)
	if err != nil {
		return nil, fmt.Errorf("signing the stage's client certificate with the agent CA: %w", err)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{{Certificate: [][]byte{der, c.cert.Raw}, PrivateKey: key}},
		// The agent's certificate is self-signed: what is checked is its key, pinned below.
		InsecureSkipVerify: true,
		VerifyConnection: func(state tls.ConnectionState) error {
			if len(state.PeerCertificates) == 0 {
				return errors.New("the agent presented no certificate")
			}
			got := wire.IdentityOf(state.PeerCertificates[0].RawSubjectPublicKeyInfo)
			if subtle.ConstantTimeCompare([]byte(got), []byte(identity)) != 1 {
				return &IdentityError{Want: identity, Got: got}
			}
			return nil
		},
	}, nil
}

// IdentityError is an agent whose key is not the one its pod logged: not the pod's agent.
type IdentityError struct{ Want, Got string }

func (e *IdentityError) Error() string {
	return fmt.Sprintf("the agent's key %s is not the pod's (%s): something else answers at the pod's address", e.Got, e.Want)
}
