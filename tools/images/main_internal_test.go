package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
)

func fakeInputs(t *testing.T) options {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"sandbox-executor", "sandbox-executor-stage", "sandbox-executor-agent", "sandbox-egress-proxy", "sandbox-executor-metrics-adapter"} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!static "+name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, []byte("-----BEGIN CERTIFICATE-----\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return options{binDir: bin, caBundle: ca, out: filepath.Join(dir, "out"), repo: "registry.example.com/se", tag: "v1.2.3", arch: "amd64"}
}

func readManifest(t *testing.T, dir string) manifest {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "images.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// untar unpacks an archive so that go-containerregistry can read it back as a layout.
func untar(t *testing.T, archive, dir string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		} else if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, h.Name)
		if h.Typeflag == tar.TypeDir {
			os.MkdirAll(p, 0o755)
			continue
		}
		data, _ := io.ReadAll(tr)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// Each image is an OCI layout archive naming its ref for containerd, with the digest images.json
// pins, the binary at its path, non-root, and the same digest when built again.
func TestBuildsReproducibleOCIArchives(t *testing.T) {
	o := fakeInputs(t)
	var out bytes.Buffer
	if err := run(o, &out); err != nil {
		t.Fatal(err)
	}
	m := readManifest(t, o.out)
	if len(m.Images) != 4 || len(m.Skipped) != 1 || !strings.HasPrefix(m.Skipped[0], "sandbox-executor-runner: ") {
		t.Fatalf("without gitlab-runner binaries: want 4 images and the runner skipped, got %+v", m)
	}
	agent := m.Images[0]
	if agent.Ref != "registry.example.com/se/sandbox-executor-agent:v1.2.3" {
		t.Errorf("agent ref %s", agent.Ref)
	}
	dir := t.TempDir()
	untar(t, filepath.Join(o.out, agent.Archive), dir)
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Digest.String() != agent.Digest || im.Manifests[0].Annotations["io.containerd.image.name"] != agent.Ref {
		t.Fatalf("index %+v: want one manifest %s named %s", im.Manifests, agent.Digest, agent.Ref)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "65532:65532" || cf.Architecture != "amd64" || strings.Join(cf.Config.Entrypoint, " ") != "/sandbox-executor-agent" {
		t.Errorf("config: user %q, arch %q, entrypoint %q", cf.Config.User, cf.Architecture, cf.Config.Entrypoint)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 2 {
		t.Fatalf("want the base layer and the binary's: %d, %v", len(layers), err)
	}
	rc, err := layers[1].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(rc)
	h, err := tr.Next()
	if err != nil || h.Name != "sandbox-executor-agent" || h.Mode != 0o755 {
		t.Errorf("agent layer: first entry %+v, %v", h, err)
	}
	// Pods that mount the image at wire.BakedDir run wire.PodAgentPath.
	if h, err := tr.Next(); err != nil || h.Name != "agent" || h.Typeflag != tar.TypeSymlink || h.Linkname != "sandbox-executor-agent" {
		t.Errorf("agent layer: second entry %+v, %v; want agent -> sandbox-executor-agent", h, err)
	}

	again := o
	again.out = filepath.Join(t.TempDir(), "again")
	if err := run(again, io.Discard); err != nil {
		t.Fatal(err)
	}
	if m2 := readManifest(t, again.out); m2.Images[0].Digest != agent.Digest || m2.BaseDigest != m.BaseDigest {
		t.Errorf("a second build gave %s (base %s), want the same %s (base %s)", m2.Images[0].Digest, m2.BaseDigest, agent.Digest, m.BaseDigest)
	}
}

// With the runner's helper, the agent image carries it and its sha256 beside it, as install-agent
// records it, so that pods mounting the image link it without hashing it.
func TestAgentImageCarriesTheHelperAndItsDigest(t *testing.T) {
	o := fakeInputs(t)
	o.runnerDir = t.TempDir()
	helper := []byte("#!static gitlab-runner-helper")
	if err := os.WriteFile(filepath.Join(o.runnerDir, "gitlab-runner-helper"), helper, 0o755); err != nil {
		t.Fatal(err)
	}
	all, err := images(o)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(helper)
	want := map[string]string{"/gitlab-runner-helper": "", "/gitlab-runner-helper.sha256": hex.EncodeToString(sum[:]) + "\n"}
	for _, f := range all[0].Files {
		if w, ok := want[f.Path]; ok {
			if w != "" && string(f.Data) != w {
				t.Errorf("%s holds %q, want %q", f.Path, f.Data, w)
			}
			delete(want, f.Path)
		}
	}
	if len(want) > 0 {
		t.Errorf("the agent image lacks %v", want)
	}
}

func TestBadOptionsAreRefused(t *testing.T) {
	for _, tc := range []struct {
		change func(*options)
		want   string
	}{
		{func(o *options) { o.tag = "latest" }, "-tag latest is refused"},
		{func(o *options) { o.tag = "" }, "-tag is required"},
		{func(o *options) { o.tag = "a:b" }, `-tag "a:b"`},
		{func(o *options) { o.only = []string{"nginx"} }, `-only: no image "nginx"`},
		{func(o *options) { o.only = []string{"sandbox-executor-runner"} }, "image sandbox-executor-runner: gitlab-runner missing"},
	} {
		o := fakeInputs(t)
		tc.change(&o)
		err := run(o, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want an error with %q, got %v", tc.want, err)
		}
	}
}
