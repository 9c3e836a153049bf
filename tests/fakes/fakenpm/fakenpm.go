// Package fakenpm is a minimal npm registry: it serves the metadata document ("packument") and
// the tarball of a few packages built in memory, enough for `npm install --registry URL` of a
// project that depends on them, where the public registry is out of reach (a job pod whose
// egress is limited to the GitLab instance).
package fakenpm

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha1"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// Package is one published version of a package. Files are relative to the package root;
// package.json is generated from Name and Version unless Files has one.
type Package struct {
	Name    string // "name" or "@scope/name"
	Version string
	Files   map[string]string
	// Bin maps command names to files of the package, linked onto PATH by `npm install -g`.
	Bin map[string]string
}

// Registry serves packages under a path prefix ("/npm/"). Create it with New.
type Registry struct {
	prefix   string
	packages map[string]published

	mu        sync.Mutex
	downloads map[string]int
}

type published struct {
	Package
	tarball   []byte
	shasum    string
	integrity string
}

// New builds the registry for packages, served under prefix (which begins and ends with "/").
func New(prefix string, packages ...Package) (*Registry, error) {
	r := &Registry{prefix: prefix, packages: map[string]published{}, downloads: map[string]int{}}
	for _, p := range packages {
		if !validName(p.Name) || p.Version == "" {
			return nil, fmt.Errorf("fakenpm: a name (or @scope/name) and a version are required, got %q@%q", p.Name, p.Version)
		}
		tarball, err := pack(p)
		if err != nil {
			return nil, err
		}
		sha1sum := sha1.Sum(tarball)
		sha512sum := sha512.Sum512(tarball)
		r.packages[p.Name] = published{
			Package: p, tarball: tarball,
			shasum:    hex.EncodeToString(sha1sum[:]),
			integrity: "sha512-" + base64.StdEncoding.EncodeToString(sha512sum[:]),
		}
	}
	return r, nil
}

// Downloads says how often each package's tarball was fetched.
func (r *Registry) Downloads(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.downloads[name]
}

// ServeHTTP answers GET <prefix><name> (the packument) and GET <prefix><name>/-/<file>.tgz.
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	rest, ok := strings.CutPrefix(req.URL.Path, r.prefix)
	name, file, isTarball := strings.Cut(rest, "/-/")
	p, known := r.packages[name]
	if !ok || !known || req.Method != http.MethodGet {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "Not found"})
		return
	}
	if isTarball {
		if file != tarballName(p.Package) {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "Not found"})
			return
		}
		r.mu.Lock()
		r.downloads[name]++
		r.mu.Unlock()
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(p.tarball)
		return
	}
	base := "http://" + req.Host + r.prefix
	writeJSON(w, http.StatusOK, map[string]any{
		"name":      p.Name,
		"dist-tags": map[string]string{"latest": p.Version},
		"versions": map[string]any{p.Version: map[string]any{
			"name": p.Name, "version": p.Version, "main": "index.js", "bin": p.Bin,
			"dist": map[string]string{"tarball": base + p.Name + "/-/" + tarballName(p.Package), "shasum": p.shasum, "integrity": p.integrity},
		}},
	})
}

// tarballName is npm's: a scoped package's tarball is named without its scope.
func tarballName(p Package) string {
	_, name, scoped := strings.Cut(p.Name, "/")
	if !scoped {
		name = p.Name
	}
	return name + "-" + p.Version + ".tgz"
}

// validName accepts "name" and "@scope/name" (npm requests the latter as @scope%2fname).
func validName(name string) bool {
	if scope, rest, scoped := strings.Cut(name, "/"); scoped {
		return len(scope) > 1 && scope[0] == '@' && !strings.ContainsAny(scope[1:]+rest, "/@") && rest != ""
	}
	return name != "" && !strings.ContainsAny(name, "/@")
}

// pack builds the package tarball as npm publishes it: a gzipped tar of package/<files>.
func pack(p Package) ([]byte, error) {
	files := map[string]string{}
	for path, content := range p.Files {
		files[path] = content
	}
	if _, ok := files["package.json"]; !ok {
		manifest, _ := json.MarshalIndent(map[string]any{"name": p.Name, "version": p.Version, "main": "index.js", "bin": p.Bin}, "", "  ")
		files["package.json"] = string(manifest) + "\n"
	}
	paths := make([]string, 0, len(files))
	for path := range files {
		paths = append(paths, path)
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	// npm packs with a fixed date, so a tarball's checksum depends only on its content.
	modTime := time.Date(1985, 10, 26, 8, 15, 0, 0, time.UTC)
	for _, path := range paths {
		content := files[path]
		hdr := &tar.Header{Name: "package/" + path, Mode: 0o644, Size: int64(len(content)), ModTime: modTime, Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write([]byte(content)); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeJSON(w http.ResponseWriter, status int, value any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(value)
}
