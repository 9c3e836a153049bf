package config

import (
	"crypto/x509"
	"fmt"
	"os"
	"strings"
)

// MinEgressAdminTokenLen is the shortest bearer token accepted, as the egress proxy's
// admin_token_file.
const MinEgressAdminTokenLen = 16

// EgressAdminToken reads the bearer token the stages send to the pools' egress proxies
// (egress_admin_token_file): "" without the key. The file is read at each call, so that a
// rotated Secret is used by the next stage; Load checks it once.
func (c *Config) EgressAdminToken() (string, error) {
	if c.EgressAdminTokenFile == "" {
		return "", nil
	}
	data, err := os.ReadFile(c.EgressAdminTokenFile)
	if err != nil {
		return "", err
	}
	token := strings.TrimSpace(string(data))
	if len(token) < MinEgressAdminTokenLen {
		return "", fmt.Errorf("%s: the token must have at least %d characters", c.EgressAdminTokenFile, MinEgressAdminTokenLen)
	}
	return token, nil
}

// EgressAdminCA reads the CA certificates that verify the egress proxies' admin certificates
// (egress_admin_ca_file): nil without the key (the system's roots). Read at each call, as the
// token: a renewed Secret is used by the next stage; Load checks it once.
func (c *Config) EgressAdminCA() (*x509.CertPool, error) {
	if c.EgressAdminCAFile == "" {
		return nil, nil
	}
	data, err := os.ReadFile(c.EgressAdminCAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%s holds no PEM certificate", c.EgressAdminCAFile)
	}
	return pool, nil
}
