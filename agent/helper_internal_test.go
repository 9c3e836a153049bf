package agent

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
)

// install copies the runner's helper beside the agent when the image carries it, and only then;
// helper links it on the stages' PATH only when its sha256 is the runner's.
func TestInstallAndHelper(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "image", "gitlab-runner-helper")
	os.MkdirAll(filepath.Dir(src), 0o755)
	content := []byte("helper 17.9.0")
	os.WriteFile(src, content, 0o755)
	vol := filepath.Join(dir, "opt")
	os.MkdirAll(vol, 0o755)
	if err := installCommand([]string{filepath.Join(vol, "agent"), filepath.Join(dir, "none"), filepath.Join(vol, "gitlab-runner-helper")}); err != nil {
		t.Fatalf("install without a helper in the image: %v", err)
	}
	if _, err := os.Stat(filepath.Join(vol, "gitlab-runner-helper")); !os.IsNotExist(err) {
		t.Errorf("a helper appeared from nowhere: %v", err)
	}
	baked := filepath.Join(vol, "gitlab-runner-helper")
	if err := installCommand([]string{filepath.Join(vol, "agent"), src, baked}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(baked); !bytes.Equal(got, content) {
		t.Fatalf("baked helper %q, want %q", got, content)
	}
	sum := sha256.Sum256(content)
	digest := hex.EncodeToString(sum[:])
	link := filepath.Join(dir, "base", "bin", "gitlab-runner")
	for _, tc := range []struct{ baked, want, answer string }{
		{baked, "0123", wire.HelperMismatch + " " + digest + "\n"},
		{filepath.Join(dir, "absent"), digest, wire.HelperAbsent + "\n"},
		{baked, digest, wire.HelperBaked + " " + digest + "\n"},
	} {
		var out bytes.Buffer
		if err := helperCommand([]string{"--baked", tc.baked, "--sha256", tc.want, "--link", link}, &out); err != nil || out.String() != tc.answer {
			t.Errorf("helper %s %s: %q, %v; want %q", tc.baked, tc.want, out.String(), err, tc.answer)
		}
		target, err := os.Readlink(link)
		if linked := err == nil && target == baked; linked != (tc.answer[0] == 'b') {
			t.Errorf("helper %s %s: linked %v", tc.baked, tc.want, linked)
		}
	}
}
