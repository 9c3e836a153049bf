package fakenpm_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha512"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/tests/fakes/fakenpm"
)

func get(t *testing.T, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, data
}

// What npm install reads: the packument's latest version, its tarball URL and integrity, and
// the tarball's package/ files.
func TestServesWhatNpmInstallReads(t *testing.T) {
	registry, err := fakenpm.New("/npm/", fakenpm.Package{Name: "tiny-greet", Version: "1.2.3", Files: map[string]string{"index.js": "module.exports = 1\n"}})
	if err != nil {
		t.Fatal(err)
	}
	server := httptest.NewServer(registry)
	defer server.Close()

	status, body := get(t, server.URL+"/npm/tiny-greet")
	var packument struct {
		DistTags map[string]string `json:"dist-tags"`
		Versions map[string]struct {
			Dist struct{ Tarball, Integrity string }
		}
	}
	if err := json.Unmarshal(body, &packument); status != http.StatusOK || err != nil {
		t.Fatalf("packument: %d %v %s", status, err, body)
	}
	latest := packument.DistTags["latest"]
	dist := packument.Versions[latest].Dist
	if latest != "1.2.3" || dist.Tarball != server.URL+"/npm/tiny-greet/-/tiny-greet-1.2.3.tgz" {
		t.Fatalf("latest %q, tarball %q", latest, dist.Tarball)
	}
	if registry.Downloads("tiny-greet") != 0 {
		t.Error("a packument request counted as a download")
	}

	status, tarball := get(t, dist.Tarball)
	sum := sha512.Sum512(tarball)
	if status != http.StatusOK || dist.Integrity != "sha512-"+base64.StdEncoding.EncodeToString(sum[:]) {
		t.Fatalf("tarball: %d, integrity %s does not match", status, dist.Integrity)
	}
	zr, err := gzip.NewReader(bytes.NewReader(tarball))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	tr := tar.NewReader(zr)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		files[hdr.Name] = string(data)
	}
	var manifest struct{ Name, Version string }
	if err := json.Unmarshal([]byte(files["package/package.json"]), &manifest); err != nil || manifest.Name != "tiny-greet" || manifest.Version != "1.2.3" {
		t.Errorf("package/package.json = %q", files["package/package.json"])
	}
	if files["package/index.js"] != "module.exports = 1\n" {
		t.Errorf("tarball files: %q", files)
	}
	if registry.Downloads("tiny-greet") != 1 {
		t.Errorf("Downloads = %d, want 1", registry.Downloads("tiny-greet"))
	}

	for _, path := range []string{"/npm/left-pad", "/npm/tiny-greet/-/tiny-greet-9.9.9.tgz", "/tiny-greet"} {
		if status, _ := get(t, server.URL+path); status != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", path, status)
		}
	}
	for _, name := range []string{"@scope", "@/x", "scope/x", "@a/b/c", ""} {
		if _, err := fakenpm.New("/npm/", fakenpm.Package{Name: name, Version: "1.0.0"}); err == nil {
			t.Errorf("package name %q was accepted", name)
		}
	}
}

// A scoped package with a command, as npm asks for it (@scope%2fname) and installs it.
func TestServesAScopedPackageWithABin(t *testing.T) {
	registry, err := fakenpm.New("/npm/", fakenpm.Package{Name: "@gitlab/duo-cli", Version: "1.0.0",
		Files: map[string]string{"bin/duo.js": "#!/usr/bin/env node\n"}, Bin: map[string]string{"duo": "bin/duo.js"}})
	if err != nil {
		t.Fatal(err)
	}
	server := httptest.NewServer(registry)
	defer server.Close()
	status, body := get(t, server.URL+"/npm/@gitlab%2fduo-cli")
	var packument struct {
		Versions map[string]struct {
			Bin  map[string]string
			Dist struct{ Tarball string }
		}
	}
	if err := json.Unmarshal(body, &packument); status != http.StatusOK || err != nil {
		t.Fatalf("packument: %d %v %s", status, err, body)
	}
	v := packument.Versions["1.0.0"]
	if v.Bin["duo"] != "bin/duo.js" || v.Dist.Tarball != server.URL+"/npm/@gitlab/duo-cli/-/duo-cli-1.0.0.tgz" {
		t.Fatalf("version 1.0.0: %+v", v)
	}
	if status, _ := get(t, v.Dist.Tarball); status != http.StatusOK || registry.Downloads("@gitlab/duo-cli") != 1 {
		t.Errorf("tarball: %d, downloads %d", status, registry.Downloads("@gitlab/duo-cli"))
	}
}
