package config

import (
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
