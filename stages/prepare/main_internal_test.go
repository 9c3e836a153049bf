package prepare

import (
	"testing"

	"github.com/sandbox-executor/sandbox-executor/internal/testing/fakecluster"
)

// The agent's "serve" in agentAhead's test is this test binary (fakecluster.StartBakedAgent).
func TestMain(m *testing.M) { fakecluster.Main(m) }
