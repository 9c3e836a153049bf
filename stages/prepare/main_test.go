package prepare

import (
	"testing"

	"github.com/sandbox-executor/sandbox-executor/tests/executortest"
)

// The agent's "serve" in agentAhead's test is this test binary (executortest.StartBakedAgent).
func TestMain(m *testing.M) { executortest.Main(m) }
