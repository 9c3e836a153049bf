package agent

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
)

// install copies the runner's helper beside the agent when the image carries it, and only then,
// with its sha256 in a file beside it; helper links it on the stages' PATH only when its sha256
// is the runner's.
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
	for _, name := range []string{"gitlab-runner-helper", "gitlab-runner-helper" + wire.HelperDigestSuffix} {
		if _, err := os.Stat(filepath.Join(vol, name)); !os.IsNotExist(err) {
			t.Errorf("%s appeared from nowhere: %v", name, err)
		}
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
	if got, err := os.ReadFile(baked + wire.HelperDigestSuffix); err != nil || string(got) != digest+"\n" {
		t.Errorf("digest file %q, %v; want %q", got, err, digest+"\n")
	}
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

// A failed install of the helper leaves no digest file of an earlier one beside it: the helper
// command would take it for the new helper's.
func TestInstallRemovesAnEarlierDigestFileFirst(t *testing.T) {
	dir := t.TempDir()
	baked := filepath.Join(dir, "gitlab-runner-helper")
	os.WriteFile(baked+wire.HelperDigestSuffix, []byte(strings.Repeat("0", 64)+"\n"), 0o644)
	// A directory opens but does not read: the copy fails.
	if err := installCommand([]string{filepath.Join(dir, "agent"), dir, baked}); err == nil {
		t.Fatal("install of a helper that does not read succeeded")
	}
	if _, err := os.Stat(baked + wire.HelperDigestSuffix); !os.IsNotExist(err) {
		t.Errorf("the earlier digest file is still there: %v", err)
	}
}

// helper answers with the digest the init container wrote beside the baked helper and does not
// hash the helper: a helper whose content is not that digest's is still linked, the trust the
// digest file is given (only who can write the baked volume could make them disagree).
func TestHelperTrustsTheDigestFileBesideTheHelper(t *testing.T) {
	dir := t.TempDir()
	baked := filepath.Join(dir, "gitlab-runner-helper")
	os.WriteFile(baked, []byte("not the preimage"), 0o755)
	sum := sha256.Sum256([]byte("helper 17.9.0"))
	digest := hex.EncodeToString(sum[:])
	os.WriteFile(baked+wire.HelperDigestSuffix, []byte(digest+"\n"), 0o644)
	link := filepath.Join(dir, "bin", "gitlab-runner")
	var out bytes.Buffer
	if err := helperCommand([]string{"--baked", baked, "--sha256", digest, "--link", link}, &out); err != nil || out.String() != wire.HelperBaked+" "+digest+"\n" {
		t.Errorf("helper: %q, %v; want %q", out.String(), err, wire.HelperBaked+" "+digest+"\n")
	}
	if target, err := os.Readlink(link); err != nil || target != baked {
		t.Errorf("link %q, %v; want %q", target, err, baked)
	}
}

// helper hashes the baked helper when the digest file beside it is missing or is not 64
// lowercase hex digits, and answers with the helper's real digest.
func TestHelperHashesTheHelperWithoutAWellFormedDigestFile(t *testing.T) {
	dir := t.TempDir()
	baked := filepath.Join(dir, "gitlab-runner-helper")
	content := []byte("helper 17.9.0")
	os.WriteFile(baked, content, 0o755)
	sum := sha256.Sum256(content)
	digest := hex.EncodeToString(sum[:])
	other := strings.Repeat("ab", 32)
	link := filepath.Join(dir, "bin", "gitlab-runner")
	for _, recorded := range []string{
		"",                      // no digest file
		other[:63] + "\n",       // too short
		other + "0\n",           // too long
		strings.Repeat("g", 64), // not hex
		strings.ToUpper(other),  // not lowercase
		other + "\n\n",          // more than one newline
	} {
		os.Remove(baked + wire.HelperDigestSuffix)
		if recorded != "" {
			os.WriteFile(baked+wire.HelperDigestSuffix, []byte(recorded), 0o644)
		}
		for _, tc := range []struct{ want, answer string }{
			{digest, wire.HelperBaked + " " + digest + "\n"},
			{other, wire.HelperMismatch + " " + digest + "\n"},
		} {
			var out bytes.Buffer
			if err := helperCommand([]string{"--baked", baked, "--sha256", tc.want, "--link", link}, &out); err != nil || out.String() != tc.answer {
				t.Errorf("digest file %q, want %s: %q, %v; want %q", recorded, tc.want, out.String(), err, tc.answer)
			}
		}
	}
}
