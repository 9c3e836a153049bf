package config_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sandbox-executor/sandbox-executor/config"
)

// placeConfig has a pool of exact images, one serving other tags of GitLab's flow image, one
// reached only as default_pool, and, when cold, cold starts of tools images.
func placeConfig(t *testing.T, cold bool) *config.Config {
	t.Helper()
	text := "namespace = \"ns\"\ndefault_pool = \"base\"\n"
	if cold {
		text += `unknown_image = "cold"
cold_template = "duo-gvisor"
cold_images = ["registry.example.com/tools/*:*", "alpine:3.*", "node:*"]
`
	}
	text += `[[pool]]
name = "node"
images = ["node:22", "registry.example.com/duo/node:22@sha256:0123"]
[[pool]]
name = "flow"
images = ["registry.gitlab.com/gitlab-org/duo-workflow/default-docker-image/workflow-generic-image:v0.0.21"]
serve_other_tags = true
[[pool]]
name = "base"
`
	cfg, err := config.Parse("c.toml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestPlace(t *testing.T) {
	const flow = "registry.gitlab.com/gitlab-org/duo-workflow/default-docker-image/workflow-generic-image"
	for _, tc := range []struct {
		name, image string
		cold        bool
		want        config.Placement
	}{
		{"no image: the default pool", "", false, config.Placement{Pool: "base"}},
		{"exact", "node:22", false, config.Placement{Pool: "node"}},
		{"exact, as the runtime resolves it", "docker.io/library/node:22", false, config.Placement{Pool: "node"}},
		{"exact with its digest", "registry.example.com/duo/node:22@sha256:0123", false, config.Placement{Pool: "node"}},
		{"exact flow image: no warning", flow + ":v0.0.21", false, config.Placement{Pool: "flow"}},
		{"another tag, served explicitly", flow + ":v0.0.22", false, config.Placement{Pool: "flow", OtherTag: true}},
		{"a digest, served explicitly", flow + "@sha256:abcd", false, config.Placement{Pool: "flow", OtherTag: true}},
		{"no tag is latest, another tag", flow, false, config.Placement{Pool: "flow", OtherTag: true}},
		{"another tag of an exact pool: cold start of the image asked for", "node:20", true, config.Placement{ColdTemplate: "duo-gvisor"}},
		{"a pool's exact image beats the cold start", "node:22", true, config.Placement{Pool: "node"}},
		{"other tags beat the cold start", flow + ":v0.0.22", true, config.Placement{Pool: "flow", OtherTag: true}},
		{"cold start", "registry.example.com/tools/jq:1", true, config.Placement{ColdTemplate: "duo-gvisor"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := placeConfig(t, tc.cold).Place(tc.image)
			if err != nil || got != tc.want {
				t.Errorf("Place(%q) = %+v, %v; want %+v", tc.image, got, err, tc.want)
			}
		})
	}
}

// A job the executor may run nowhere gets one line naming every pool with the images it serves,
// the cold-start patterns if any, and how to reach default_pool.
func TestPlaceRefusesNamingPoolsAndImages(t *testing.T) {
	pools := `no pool runs it (pool node serves node:22, registry.example.com/duo/node:22@sha256:0123; ` +
		`pool flow serves registry.gitlab.com/gitlab-org/duo-workflow/default-docker-image/workflow-generic-image:v0.0.21 and other tags of it)`
	for _, tc := range []struct {
		name, image string
		cold        bool
		want        string
	}{
		{"another tag of an exact pool", "node:20", false, `image not allowed: "node:20": ` + pools + "; remove image: from the job to run in default_pool base"},
		{"another repository", "evil/node:22", false, `image not allowed: "evil/node:22": ` + pools},
		{"another tag of the same name elsewhere", "registry.example.com/duo/node:23", false, pools},
		{"a repository beside the flow image's", "registry.gitlab.com/gitlab-org/duo-workflow/default-docker-image/workflow-generic-image-evil:v0.0.21", false, pools},
		// "*" does not cross "/": a cold pattern never widens to another registry path.
		{"neither pool nor cold pattern", "registry.example.com/tools/evil/jq:1", true,
			pools + `; cold starts (unknown_image = "cold") allow alpine:3.*, node:*, registry.example.com/tools/*:*; remove image: from the job to run in default_pool base`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := placeConfig(t, tc.cold).Place(tc.image)
			if !errors.Is(err, config.ErrImageNotAllowed) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("Place(%q) = %v; want one line containing %q", tc.image, err, tc.want)
			}
			if !tc.cold && strings.Contains(err.Error(), "cold") {
				t.Errorf("Place(%q) = %v; without unknown_image = \"cold\" it names no cold starts", tc.image, err)
			}
		})
	}
	bare, err := config.Parse("c.toml", []byte("namespace = \"ns\"\n[[pool]]\nname = \"p\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bare.Place("alpine:3.20"); err == nil || !strings.Contains(err.Error(), "no pool serves an image") {
		t.Errorf("pools without images: Place = %v, want a refusal saying no pool serves an image", err)
	}
	if _, err := bare.Place(""); err == nil || !strings.Contains(err.Error(), "no default_pool") {
		t.Errorf("no image and no default_pool: Place = %v", err)
	}
}

func TestSameImage(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"node:22", "docker.io/library/node:22", true},
		{"node", "node:latest", true},
		{"index.docker.io/user/app:1", "user/app:1", true},
		{"localhost/app:1", "docker.io/localhost/app:1", false},
		{"registry.example.com:5000/app:1", "registry.example.com:5000/app:1", true},
		{"registry.example.com:5000/app:1", "registry.example.com:5000/app:2", false},
		{"app:1@sha256:aa", "app:1", false},
		{"node:22", "node:22-slim", false},
	} {
		if got := config.SameImage(tc.a, tc.b); got != tc.same {
			t.Errorf("SameImage(%q, %q) = %t, want %t", tc.a, tc.b, got, tc.same)
		}
	}
}
