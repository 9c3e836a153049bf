package fakecluster

import (
	"testing"
	"time"

	"github.com/sandbox-executor/sandbox-executor/agentca"
)

// AgentCA is an agent CA made for a test: the executor's side signs client certificates with it,
// the agent's side trusts its certificate.
func AgentCA(t testing.TB) *agentca.CA {
	t.Helper()
	ca, err := agentca.New("test agent CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}
