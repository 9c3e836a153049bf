package app_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/executor"
)

// A job with artifacts needs the runner's helper in its pod. A pod whose init container baked
// in the very helper the runner has (same sha256) gets it linked on the stages' PATH and nothing
// copied; a baked helper of another build, or none, gets the runner's copied over exec, as
// before, the first with a warning. The job log says which.
func TestPrepareUsesTheBakedRunnerHelper(t *testing.T) {
	helper := filepath.Join(t.TempDir(), "gitlab-runner-helper")
	content := []byte("\x7fELF the runner's helper, build 17.9.0")
	if err := os.WriteFile(helper, content, 0o755); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(content)
	digest := hex.EncodeToString(sum[:])
	for _, tc := range []struct {
		name   string
		baked  []byte // nil: nothing baked
		copied bool
		want   string
	}{
		{"baked and matching", content, false, "Runner helper: baked in the pod (sha256 " + digest[:12] + "…)"},
		{"baked but another build", []byte("\x7fELF another helper"), true, "is not this runner's (sha256 " + digest[:12] + "…): copying this runner's"},
		{"absent", nil, true, "Copied the runner helper"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarnessWithConfig(t, "ci:bookworm", fmt.Sprintf("helper_binary = %q", helper))
			withArtifacts(t, h)
			h.local.BakedDir = filepath.Join(t.TempDir(), "baked")
			if err := os.MkdirAll(h.local.BakedDir, 0o755); err != nil {
				t.Fatal(err)
			}
			baked := filepath.Join(h.local.BakedDir, filepath.Base(wire.BakedHelperPath))
			if tc.baked != nil {
				if err := os.WriteFile(baked, tc.baked, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			code, out, errOut := h.run("prepare")
			if code != 0 {
				t.Fatalf("prepare: exit %d\n%s%s", code, out, errOut)
			}
			log := out + errOut
			if !strings.Contains(log, tc.want) {
				t.Errorf("prepare's log lacks %q:\n%s", tc.want, log)
			}
			if copied := helperCopied(h); copied != tc.copied {
				t.Errorf("the helper copied over exec: %v, want %v\n%s", copied, tc.copied, log)
			}
			if strings.Contains(log, "Copied the runner helper") != tc.copied {
				t.Errorf("the copy line does not match the copy:\n%s", log)
			}
			link := filepath.Join(filepath.Dir(h.local.Agent.StagesDir()), "bin", executor.HelperName)
			target, err := os.Readlink(link)
			if !tc.copied && (err != nil || target != baked) {
				t.Errorf("the baked helper is not linked on the stages' PATH: %s -> %q, %v", link, target, err)
			}
			if tc.copied && err == nil {
				t.Errorf("a baked helper that is not the runner's was linked: %s -> %s", link, target)
			}
		})
	}
}

// helperCopied says whether prepare streamed the helper into the pod over exec.
func helperCopied(h *harness) bool {
	for _, c := range h.local.Commands() {
		if len(c) > 4 && c[0] == "/bin/sh" && c[4] == wire.BinDir {
			return true
		}
	}
	return false
}

// withArtifacts gives the harness's job artifacts, for which it needs the runner's helper.
func withArtifacts(t *testing.T, h *harness) {
	t.Helper()
	path := h.env["JOB_RESPONSE_FILE"]
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var job map[string]any
	if err := json.Unmarshal(data, &job); err != nil {
		t.Fatal(err)
	}
	job["artifacts"] = []map[string]any{{"paths": []string{"out/"}}}
	data, _ = json.Marshal(job)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
