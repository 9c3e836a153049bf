package agent

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"strings"
	"sync"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
)

// serverTLS is the network path's TLS: a key made when the daemon starts, which never leaves
// its memory (its identity is the hash of the public half), and client certificates required,
// signed by one of the agent CA certificates the pod was given. TLS 1.3 only: forward secrecy,
// no renegotiation, and no 0-RTT data, so a recorded session cannot be replayed.
func serverTLS(clientCAPEM []byte) (*tls.Config, string, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(clientCAPEM) {
		return nil, "", errors.New("the agent CA (" + wire.ClientCAEnv + ") has no PEM certificate")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, "", err
	}
	// Self-signed: the executor pins the key, not a chain, so names and dates are only
	// informative. A pod lives for one job; a year outlives any.
	template := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "sandbox-executor-agent"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		return nil, "", err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, "", err
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
	}, wire.IdentityOf(leaf.RawSubjectPublicKeyInfo), nil
}

// jobOf is the job a verified client certificate was issued for: its binding, from the URI SAN.
func jobOf(state tls.ConnectionState) (string, error) {
	if len(state.PeerCertificates) == 0 {
		return "", errors.New("no client certificate")
	}
	for _, uri := range state.PeerCertificates[0].URIs {
		if job, found := strings.CutPrefix(uri.String(), wire.JobURIPrefix); found && job != "" {
			return job, nil
		}
	}
	return "", errors.New("the client certificate names no job")
}

// owner is the job a pod belongs to: the first one whose executor reached the agent. A pod is
// single-use, so every later connection must be that job's.
type owner struct {
	mu  sync.Mutex
	job string
	// bound is called when the pod is bound to its job (nil: nothing to do).
	bound func()
}

// admit binds the pod to job if it is not bound yet, and reports whether job is its owner.
func (o *owner) admit(job string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.job == "" {
		o.job = job
		if o.bound != nil {
			go o.bound()
		}
	}
	return o.job == job
}
