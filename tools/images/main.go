// Command images builds the project's container images without Docker: static binaries layered
// on a minimal base that is itself built here (no registry to pull one from), written as OCI
// image-layout archives that `ctr images import` and registries (crane push, skopeo copy) accept.
//
//	go run ./tools/images -bin bin/linux-amd64 -arch amd64 -tag v0.1.0 -out dist/images
//
// The base is an empty filesystem with CA certificates, /etc/passwd and /etc/group for the
// non-root user 65532, and a /tmp. Every file has a fixed owner and time, so the same inputs give
// the same digests; images.json in the output pins the base and each image by digest.
package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/sandbox-executor/sandbox-executor/agent/wire"
	"github.com/sandbox-executor/sandbox-executor/executor"
)

// nonRootUID is the user every image runs as (the same number distroless uses).
const nonRootUID = 65532

// file is one entry of a layer: Src on the build machine, or Data, or a symbolic link to Link;
// a directory when all three are empty.
type file struct {
	Path string
	Src  string
	Data []byte
	Link string
	Mode int64
	UID  int
}

// image is one image the project ships.
type image struct {
	// Name is the archive's name and the last part of the repository.
	Name       string
	Files      []file
	Entrypoint []string
	// Needs says which inputs the image needs, to skip it with a reason when one is missing
	// (the runner's binaries exist for amd64 only here).
	Needs []string
}

type options struct {
	binDir, runnerDir, caBundle, out, repo, tag, arch string
	only                                              []string
}

func main() {
	var o options
	var only string
	flag.StringVar(&o.binDir, "bin", "bin", "directory with this project's static binaries for -arch")
	flag.StringVar(&o.runnerDir, "runner", "", "directory with gitlab-runner and gitlab-runner-helper for -arch (the runner image is skipped without it)")
	flag.StringVar(&o.caBundle, "ca-bundle", "/etc/ssl/certs/ca-certificates.crt", "CA certificates for the base image")
	flag.StringVar(&o.out, "out", "", "output directory (required)")
	flag.StringVar(&o.repo, "repo", "sandbox-executor.local", "image repository prefix: images are REPO/NAME:TAG")
	flag.StringVar(&o.tag, "tag", "", "image tag, e.g. from git describe (required; never latest)")
	flag.StringVar(&o.arch, "arch", "amd64", "image architecture (the binaries must match it)")
	flag.StringVar(&only, "only", "", "comma-separated image names to build (default: all)")
	flag.Parse()
	if only != "" {
		o.only = strings.Split(only, ",")
	}
	if err := run(o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func validate(o options) error {
	switch {
	case o.out == "":
		return errors.New("-out is required")
	case o.tag == "":
		return errors.New("-tag is required (for example $(git describe --tags --always --dirty))")
	case o.tag == "latest":
		return errors.New("-tag latest is refused: tag images with a version")
	case strings.ContainsAny(o.tag, ":/@ "):
		return fmt.Errorf("-tag %q: a tag has no ':', '/', '@' or spaces", o.tag)
	}
	return nil
}

// images lists the project's images for the options' directories.
func images(o options) ([]image, error) {
	bin := func(name string) string { return filepath.Join(o.binDir, name) }
	runner := func(name string) string { return filepath.Join(o.runnerDir, name) }
	// /agent is where job pods that mount this image as a volume at wire.BakedDir run the agent
	// from (wire.PodAgentPath), the same path install-agent copies it to.
	agentFiles := []file{
		{Path: "/sandbox-executor-agent", Src: bin("sandbox-executor-agent"), Mode: 0o755},
		{Path: "/" + path.Base(wire.PodAgentPath), Link: "sandbox-executor-agent", Mode: 0o777},
	}
	if digest, err := executor.HelperDigest(runner("gitlab-runner-helper")); err == nil {
		// Without it (no make runner) the agent image is built all the same: prepare then
		// copies the helper into the jobs that need it, as before. Its sha256 beside it is what
		// install-agent records as it copies (wire.HelperDigestSuffix), so a pod that mounts
		// the image links the helper without hashing 46 MB at prepare.
		agentFiles = append(agentFiles,
			file{Path: "/gitlab-runner-helper", Src: runner("gitlab-runner-helper"), Mode: 0o755},
			file{Path: "/gitlab-runner-helper" + wire.HelperDigestSuffix, Data: []byte(digest + "\n"), Mode: 0o644})
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return []image{
		{
			// Job pods mount this image read-only at wire.BakedDir (images.agentVolume image), or
			// the SandboxTemplate's init container runs "/sandbox-executor-agent install DIR/agent
			// /gitlab-runner-helper DIR/gitlab-runner-helper" to copy the agent and the runner's
			// helper (the same file as the runner image's: prepare links it for jobs with cache
			// or artifacts when its sha256 is the runner's, instead of copying it) into a volume
			// the job container (any image) runs them from.
			Name:       "sandbox-executor-agent",
			Files:      agentFiles,
			Entrypoint: []string{"/sandbox-executor-agent"},
			Needs:      []string{bin("sandbox-executor-agent")},
		},
		{
			// gc (the CronJob) and doctor; later other operator verbs.
			Name:       "sandbox-executor",
			Files:      []file{{Path: "/usr/local/bin/sandbox-executor", Src: bin("sandbox-executor"), Mode: 0o755}},
			Entrypoint: []string{"/usr/local/bin/sandbox-executor"},
			Needs:      []string{bin("sandbox-executor")},
		},
		{
			Name:       "sandbox-egress-proxy",
			Files:      []file{{Path: "/usr/local/bin/sandbox-egress-proxy", Src: bin("sandbox-egress-proxy"), Mode: 0o755}},
			Entrypoint: []string{"/usr/local/bin/sandbox-egress-proxy"},
			Needs:      []string{bin("sandbox-egress-proxy")},
		},
		{
			// The External metrics adapter of pools with autoscaling (the chart's metricsAdapter).
			Name:       "sandbox-executor-metrics-adapter",
			Files:      []file{{Path: "/usr/local/bin/sandbox-executor-metrics-adapter", Src: bin("sandbox-executor-metrics-adapter"), Mode: 0o755}},
			Entrypoint: []string{"/usr/local/bin/sandbox-executor-metrics-adapter"},
			Needs:      []string{bin("sandbox-executor-metrics-adapter")},
		},
		{
			// gitlab-runner with sandbox-executor as its custom executor; the agent is copied into
			// job pods whose template does not bake it in, the helper into jobs with cache or
			// artifacts. sandbox-executor's start-runner registers (with retries) and runs it.
			Name: "sandbox-executor-runner",
			Files: []file{
				{Path: "/usr/bin/gitlab-runner", Src: runner("gitlab-runner"), Mode: 0o755},
				{Path: "/usr/bin/gitlab-runner-helper", Src: runner("gitlab-runner-helper"), Mode: 0o755},
				{Path: "/usr/local/bin/sandbox-executor", Src: bin("sandbox-executor"), Mode: 0o755},
				{Path: "/usr/local/bin/sandbox-executor-stage", Src: bin("sandbox-executor-stage"), Mode: 0o755},
				{Path: "/usr/local/bin/sandbox-executor-agent", Src: bin("sandbox-executor-agent"), Mode: 0o755},
				{Path: "/home/nonroot/.gitlab-runner", Mode: 0o755, UID: nonRootUID},
			},
			Entrypoint: []string{"/usr/local/bin/sandbox-executor", "start-runner"},
			Needs:      []string{runner("gitlab-runner"), runner("gitlab-runner-helper"), bin("sandbox-executor"), bin("sandbox-executor-stage"), bin("sandbox-executor-agent")},
		},
	}, nil
}

// built is one line of images.json.
type built struct {
	Name   string `json:"name"`
	Ref    string `json:"ref"`
	Digest string `json:"digest"`
	Arch   string `json:"arch"`
	// Archive is the OCI image-layout tarball, relative to images.json.
	Archive string `json:"archive"`
}

type manifest struct {
	Tag        string   `json:"tag"`
	BaseDigest string   `json:"baseDigest"`
	Images     []built  `json:"images"`
	Skipped    []string `json:"skipped,omitempty"`
}

func run(o options, stdout io.Writer) error {
	if err := validate(o); err != nil {
		return err
	}
	all, err := images(o)
	if err != nil {
		return err
	}
	for _, name := range o.only {
		if !slices.ContainsFunc(all, func(i image) bool { return i.Name == name }) {
			return fmt.Errorf("-only: no image %q (images: %s)", name, imageNames(all))
		}
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	base, err := baseImage(o.caBundle, o.arch)
	if err != nil {
		return err
	}
	baseDigest, err := base.Digest()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "base %s (linux/%s)\n", baseDigest, o.arch)
	m := manifest{Tag: o.tag, BaseDigest: baseDigest.String()}
	for _, spec := range all {
		if len(o.only) > 0 && !slices.Contains(o.only, spec.Name) {
			continue
		}
		if missing := missingInputs(spec.Needs); missing != "" {
			if len(o.only) > 0 {
				return fmt.Errorf("image %s: %s missing", spec.Name, missing)
			}
			m.Skipped = append(m.Skipped, spec.Name+": "+missing+" missing")
			fmt.Fprintf(stdout, "skipped %s: %s missing\n", spec.Name, missing)
			continue
		}
		b, err := buildImage(base, spec, o)
		if err != nil {
			return fmt.Errorf("image %s: %w", spec.Name, err)
		}
		m.Images = append(m.Images, b)
		fmt.Fprintf(stdout, "%s %s %s\n", b.Ref, b.Digest, filepath.Join(o.out, b.Archive))
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(o.out, "images.json"), append(data, '\n'), 0o644)
}

func imageNames(all []image) string {
	var names []string
	for _, i := range all {
		names = append(names, i.Name)
	}
	return strings.Join(names, ", ")
}

func missingInputs(paths []string) string {
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			return p
		}
	}
	return ""
}

// baseImage is the minimal base every image is layered on.
func baseImage(caBundle, arch string) (v1.Image, error) {
	ca, err := os.ReadFile(caBundle)
	if err != nil {
		return nil, fmt.Errorf("CA certificates for the base image: %w", err)
	}
	layer, err := layerOf([]file{
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		// Go's resolver reads it to decide between /etc/hosts and DNS.
		{Path: "/etc/nsswitch.conf", Mode: 0o644, Data: []byte("hosts: files dns\n")},
		{Path: "/etc/ssl/certs/ca-certificates.crt", Mode: 0o644, Data: ca},
		{Path: "/home/nonroot", Mode: 0o755, UID: nonRootUID},
		{Path: "/root", Mode: 0o700},
		{Path: "/tmp", Mode: 0o1777},
	})
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(ociEmpty(), layer)
	if err != nil {
		return nil, err
	}
	return withConfig(img, arch, v1.Config{
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"},
		User:       fmt.Sprintf("%d:%d", nonRootUID, nonRootUID),
		WorkingDir: "/",
	})
}

func ociEmpty() v1.Image {
	return mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
}

func withConfig(img v1.Image, arch string, cfg v1.Config) (v1.Image, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Config = cfg
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	return mutate.ConfigFile(img, cf)
}

func buildImage(base v1.Image, spec image, o options) (built, error) {
	layer, err := layerOf(spec.Files)
	if err != nil {
		return built{}, err
	}
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return built{}, err
	}
	cf, err := base.ConfigFile()
	if err != nil {
		return built{}, err
	}
	cfg := cf.Config
	cfg.Entrypoint = spec.Entrypoint
	cfg.Labels = map[string]string{
		"org.opencontainers.image.title":    spec.Name,
		"org.opencontainers.image.version":  o.tag,
		"org.opencontainers.image.licenses": "Apache-2.0",
	}
	img, err = withConfig(img, o.arch, cfg)
	if err != nil {
		return built{}, err
	}
	digest, err := img.Digest()
	if err != nil {
		return built{}, err
	}
	ref := fmt.Sprintf("%s/%s:%s", o.repo, spec.Name, o.tag)
	archive := fmt.Sprintf("%s-%s.oci.tar", spec.Name, o.arch)
	if err := writeArchive(img, ref, o.tag, filepath.Join(o.out, archive)); err != nil {
		return built{}, err
	}
	return built{Name: spec.Name, Ref: ref, Digest: digest.String(), Arch: o.arch, Archive: archive}, nil
}

// layerOf makes one reproducible layer: parent directories included, fixed owners and times.
func layerOf(files []file) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0).UTC()
	seen := map[string]bool{}
	for _, f := range files {
		var dirs []string
		for d := filepath.Dir(f.Path); d != "/"; d = filepath.Dir(d) {
			dirs = append([]string{d}, dirs...)
		}
		for _, d := range dirs {
			if seen[d] {
				continue
			}
			seen[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: 0o755, ModTime: epoch}); err != nil {
				return nil, err
			}
		}
		hdr := &tar.Header{Name: strings.TrimPrefix(f.Path, "/"), Mode: f.Mode, ModTime: epoch, Uid: f.UID, Gid: f.UID}
		data := f.Data
		if f.Src != "" {
			var err error
			if data, err = os.ReadFile(f.Src); err != nil {
				return nil, err
			}
		}
		switch {
		case f.Link != "":
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, f.Link
		case f.Src == "" && f.Data == nil:
			hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
			seen[f.Path] = true
		default:
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	raw := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil },
		tarball.WithMediaType(types.OCILayer))
}

// writeArchive writes an OCI image layout holding img as a tarball. containerd names the image
// after io.containerd.image.name; other tools read org.opencontainers.image.ref.name (the tag).
func writeArchive(img v1.Image, ref, tag, out string) error {
	dir, err := os.MkdirTemp(filepath.Dir(out), ".layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	path, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := path.AppendImage(img, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          ref,
		"org.opencontainers.image.ref.name": tag,
	})); err != nil {
		return err
	}
	return tarDir(dir, out)
}

// tarDir packs dir's files (oci-layout, index.json, blobs/) into out, replaced atomically.
func tarDir(dir, out string) error {
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	epoch := time.Unix(0, 0).UTC()
	walkErr := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: rel + "/", Mode: 0o755, ModTime: epoch})
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Mode: 0o644, Size: int64(len(data)), ModTime: epoch}); err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	})
	if err := errors.Join(walkErr, tw.Close(), f.Close()); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, out)
}
