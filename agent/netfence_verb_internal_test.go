package agent

import (
	"bytes"
	"strings"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
)

// The netfence verb is package netfence's Command; these check only that the agent runs it.
func TestNetfenceVerbRunsNetfence(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"netfence", "-h"}, nil, &stdout, &stderr); code != 0 || !strings.HasPrefix(stdout.String(), "usage: sandbox-executor-agent netfence") {
		t.Errorf("netfence -h: exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
	stdout.Reset()
	code := Main([]string{"netfence", "--allow", "10.0.0.0/8"}, nil, &stdout, &stderr)
	if line := stderr.String(); code != wire.ExitAgentFailure || !strings.HasPrefix(line, "sandbox-executor-agent netfence: ") || strings.Count(line, "\n") != 1 {
		t.Errorf("netfence with a bad --allow: exit %d, stderr %q; want exit %d and one line", code, line, wire.ExitAgentFailure)
	}
	// A reply port the agent does not listen on: the same exit, one line naming the agent's ports.
	stderr.Reset()
	code = Main([]string{"netfence", "--reply-to", "10.88.0.0/16", "--reply-port", "8080"}, nil, &stdout, &stderr)
	if line := stderr.String(); code != wire.ExitAgentFailure || !strings.HasPrefix(line, "sandbox-executor-agent netfence: ") || !strings.Contains(line, "8080 is not a port of the agent's: name 7543") || strings.Count(line, "\n") != 1 {
		t.Errorf("netfence --reply-port 8080: exit %d, stderr %q; want exit %d and one line naming the agent's ports", code, line, wire.ExitAgentFailure)
	}
}
