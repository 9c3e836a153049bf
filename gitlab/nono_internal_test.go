package gitlab

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/tools/duoflow"
)

// nonoWithoutLandlock stands in for nono on a kernel without Landlock: nono 0.66's last line
// and exit status when its Landlock ABI probe finds none.
const nonoWithoutLandlock = `#!/bin/sh
echo "nono: Sandbox initialization failed: Landlock not available. Requires Linux kernel 5.13+ with Landlock enabled." >&2
exit 1
`

// nonoWithLandlock stands in for nono where Landlock works: it runs the command after "--".
const nonoWithLandlock = `#!/bin/sh
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done
shift
exec "$@"
`

// TestNonoWatchReadsGitLabsScript runs GitLab's nono-wrapped flow command (duoflow.NonoWrapped)
// with bash and each kind of nono, writes its output to a NonoWatch a byte at a time, and checks what the
// watch heard: GitLab's refusal and its cause, or nothing when the flow ran.
func TestNonoWatchReadsGitLabsScript(t *testing.T) {
	script := []byte(duoflow.NonoWrapped("duo run --existing-session-id 42 --connection-type websocket", "gitlab.example.com"))
	if !WrapsNono(script) {
		t.Fatal("WrapsNono: GitLab's nono-wrapped script not recognised")
	}
	for _, c := range []struct {
		name, nono, refused string
		exit                int
	}{
		{"no nono in the image", "", "the image has no nono", 1},
		{"nono without Landlock, as under gVisor", nonoWithoutLandlock, "nono's Landlock pre-check failed", 1},
		{"nono with Landlock", nonoWithLandlock, "", 127}, // it runs the flow: duo, absent here
	} {
		t.Run(c.name, func(t *testing.T) {
			bin := t.TempDir()
			for _, tool := range []string{"bash", "env", "git", "true"} {
				if path, err := exec.LookPath(tool); err == nil {
					if err := os.Symlink(path, filepath.Join(bin, tool)); err != nil {
						t.Fatal(err)
					}
				}
			}
			if c.nono != "" {
				if err := os.WriteFile(filepath.Join(bin, "nono"), []byte(c.nono), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.Command(filepath.Join(bin, "bash"), "-e", "-c", string(script))
			cmd.Env = []string{"PATH=" + bin, "HOME=" + t.TempDir()}
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			if got := cmd.ProcessState.ExitCode(); got != c.exit {
				t.Fatalf("the script exited %d (%v), want %d:\n%s", got, err, c.exit, out.String())
			}
			var passed bytes.Buffer
			w := &NonoWatch{W: &passed}
			for _, b := range out.Bytes() {
				if _, err := w.Write([]byte{b}); err != nil {
					t.Fatal(err)
				}
			}
			if !bytes.Equal(passed.Bytes(), out.Bytes()) {
				t.Errorf("the watch changed the output:\n%q\nwant\n%q", passed.String(), out.String())
			}
			if w.Refused() != c.refused {
				t.Errorf("Refused() = %q, want %q; output:\n%s", w.Refused(), c.refused, out.String())
			}
		})
	}
}

func TestNonoWatchHearsOnlyGitLabsLines(t *testing.T) {
	for _, c := range []struct{ output, refused string }{
		{"Error: nono not found on PATH (image must ship it), refusing to run without a sandbox\r\n", "the image has no nono"},
		{"x\nError: nono found but the sandbox pre-check failed, refusing to run without a sandbox\n", "nono's Landlock pre-check failed"},
		// Not at a line's start: the runner's echo of the script, a job printing about nono.
		{"\x1b[32;1m$ echo \"Error: nono not found on PATH\"\x1b[0;m\n", ""},
		{"the job says: Error: nono not found on PATH\n", ""},
		// A line's end, unterminated, is not a line yet.
		{"Error: nono not found on PATH", ""},
		{strings.Repeat("y", 5000) + "Error: nono not found on PATH\n", ""},
		{"", ""},
	} {
		w := &NonoWatch{W: &bytes.Buffer{}}
		if _, err := w.Write([]byte(c.output)); err != nil {
			t.Fatal(err)
		}
		if w.Refused() != c.refused {
			t.Errorf("after %q: Refused() = %q, want %q", c.output, w.Refused(), c.refused)
		}
	}
	if WrapsNono([]byte("srt --settings /var/tmp/.gitlab-sandbox/srt-settings.json duo run\necho nono\n")) {
		t.Error("WrapsNono: SRT's script taken for nono's")
	}
}

func TestNonoRefusalSaysCauseIsolationAndFix(t *testing.T) {
	line := NonoRefusal("nono's Landlock pre-check failed", "gvisor", "duo-flow", "its NetworkPolicy and the egress proxy")
	for _, want := range []string{"nono's Landlock pre-check failed", "Landlock", "gVisor does not implement", "google/gvisor#13439",
		"RuntimeClass gvisor", "its NetworkPolicy and the egress proxy of pool duo-flow", "duo_workflow_nono_sandbox off", "docs/agent-config.md#nono"} {
		if !strings.Contains(line, want) {
			t.Errorf("%q lacks %q", line, want)
		}
	}
	if strings.Contains(line, "\n") {
		t.Errorf("%q: more than one line", line)
	}
}
