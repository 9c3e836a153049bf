package quickstart_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/tests/harness/quickstart"
)

const doc = "# Doc\n\n" +
	"<!-- quickstart: a, b -->\n```sh\nkubectl create namespace ns   # a comment\n# a comment line\n\nhelm install r chart.tgz \\\n  --set 'x=a b' \\\n  -f v.yaml\n```\n\n" +
	"<!-- quickstart: a file=v.yaml -->\n```yaml\nurl: https://gitlab.example.com\n```\n\n" +
	"```sh\nnot marked\n```\n\n" +
	"- item\n\n  <!-- quickstart: b -->\n  ```sh\n  kubectl get pods\n  ```\n"

func writeDoc(t *testing.T, text string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "doc.md"), []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestReadJoinsContinuationsAndSharesBlocks(t *testing.T) {
	qs, err := quickstart.Read(writeDoc(t, doc), "doc.md")
	if err != nil {
		t.Fatal(err)
	}
	a, b := qs["a"], qs["b"]
	if a == nil || b == nil || len(qs) != 2 {
		t.Fatalf("quickstarts %v, want a and b", qs)
	}
	wantA := []string{"kubectl create namespace ns", "helm install r chart.tgz --set 'x=a b' -f v.yaml"}
	if !slices.Equal(a.Commands, wantA) {
		t.Errorf("a's commands %q, want %q", a.Commands, wantA)
	}
	if want := append(slices.Clone(wantA), "kubectl get pods"); !slices.Equal(b.Commands, want) {
		t.Errorf("b's commands %q, want %q (the indented block too)", b.Commands, want)
	}
	if a.Files["v.yaml"] != "url: https://gitlab.example.com\n" || len(b.Files) != 0 {
		t.Errorf("files a %q, b %q", a.Files, b.Files)
	}
	argv, err := a.Argv(quickstart.Placeholders{"ns": "test-ns", "https://gitlab.example.com": "https://10.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"helm", "install", "r", "chart.tgz", "--set", "x=a b", "-f", "v.yaml"}; !slices.Equal(argv[1], want) {
		t.Errorf("argv %q, want %q", argv[1], want)
	}
	if argv[0][3] != "test-ns" {
		t.Errorf("placeholder not replaced: %q", argv[0])
	}
}

func TestMarkerWithoutBlockIsRefused(t *testing.T) {
	_, err := quickstart.Read(writeDoc(t, "<!-- quickstart: a -->\n\n```sh\nls\n```\n"), "doc.md")
	if err == nil || !strings.Contains(err.Error(), "doc.md:1: the quickstart marker is not right above a fenced block") {
		t.Errorf("got %v", err)
	}
}

func TestPlaceholdersLongestFirst(t *testing.T) {
	p := quickstart.Placeholders{"registry.example.com/duo/ci": "local/ci", "registry.example.com/duo/ci:bookworm": "local/ci:1"}
	if got := p.Apply("image: registry.example.com/duo/ci:bookworm, images: [registry.example.com/duo/ci:*]"); got != "image: local/ci:1, images: [local/ci:*]" {
		t.Errorf("got %q", got)
	}
	ns := quickstart.Placeholders{"ci-sandbox": "e2e-1"}
	if got := ns.Apply("-n ci-sandbox my-ci-sandbox ci-sandbox2 ns/ci-sandbox"); got != "-n e2e-1 my-ci-sandbox ci-sandbox2 ns/e2e-1" {
		t.Errorf("got %q: only whole words are placeholders", got)
	}
}

func TestArgsRefusesShell(t *testing.T) {
	for _, command := range []string{"kubectl get pods | grep x", "echo $(id)", "a > b", "echo 'open"} {
		if _, err := quickstart.Args(command); err == nil {
			t.Errorf("%q was split, want refused", command)
		}
	}
	got, err := quickstart.Args(`helm --set "a=b c" x\ y`)
	if err != nil || !slices.Equal(got, []string{"helm", "--set", "a=b c", "x y"}) {
		t.Errorf("got %q, %v", got, err)
	}
}
