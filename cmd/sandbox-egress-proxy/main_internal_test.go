package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

func TestCommandLineErrorsAreOneLine(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "config.toml")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--bogus"}, exitUsage, "flag provided but not defined: -bogus: see sandbox-egress-proxy --help"},
		{[]string{"stray"}, exitUsage, `unexpected arguments ["stray"]`},
		{[]string{"-config", missing, "-check"}, exitFailure, missing},
	} {
		var stdout, stderr bytes.Buffer
		code := proxyMain(append([]string{"sandbox-egress-proxy"}, tc.args...), &stdout, &stderr)
		if code != tc.code || strings.Count(stderr.String(), "\n") != 1 || !strings.Contains(stderr.String(), tc.want) || stdout.Len() > 0 {
			t.Errorf("%q: exit %d (want %d), stdout %q, stderr %q (want one line with %q)", tc.args, code, tc.code, stdout.String(), stderr.String(), tc.want)
		}
	}
}

func TestHelpExitsZero(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := proxyMain([]string{"sandbox-egress-proxy", "--help"}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "--admin-listen") {
		t.Errorf("--help: exit %d, %q", code, stdout.String())
	}
}
