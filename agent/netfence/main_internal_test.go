package netfence

import (
	"fmt"
	"os"
	"testing"
)

// TestMain lets the test binary be ProveRuntime's probe child: ProveRuntime re-executes its own
// binary, which in a test is this one, with ProbeRoleEnv set; the netfence verb then runs the
// probe, as it does in the agent.
func TestMain(m *testing.M) {
	if os.Getenv(ProbeRoleEnv) != "" {
		if err := Command(nil, os.Stdout); err != nil {
			fmt.Fprintf(os.Stderr, "sandbox-executor-agent netfence: %v\n", err)
			os.Exit(3)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
