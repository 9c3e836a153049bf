package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestHelpSaysWhatTheAgentIs(t *testing.T) {
	for _, arg := range []string{"--help", "-h", "help"} {
		var stdout, stderr bytes.Buffer
		code := run([]string{arg}, strings.NewReader(""), &stdout, &stderr)
		if code != 0 || !strings.Contains(stdout.String(), "the agent of sandbox-executor inside a job pod") || stderr.Len() > 0 {
			t.Errorf("%s: exit %d, stdout %q, stderr %q", arg, code, stdout.String(), stderr.String())
		}
	}
}

func TestOtherCommandsAreTheAgents(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"bogus"}, strings.NewReader(""), &stdout, &stderr); code == 0 || !strings.Contains(stderr.String(), `unknown command "bogus"`) {
		t.Errorf("bogus: exit %d, stderr %q", code, stderr.String())
	}
}
