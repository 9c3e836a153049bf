package config

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// PoolNames lists the configured pools, for messages.
func (c *Config) PoolNames() []string {
	names := make([]string, 0, len(c.Pools))
	for _, p := range c.Pools {
		names = append(names, p.Name)
	}
	return names
}

// Pool returns the named pool, or nil.
func (c *Config) Pool(name string) *Pool {
	for i := range c.Pools {
		if c.Pools[i].Name == name {
			return &c.Pools[i]
		}
	}
	return nil
}

// AllowedImages lists every image pattern some pool serves, sorted, for messages.
func (c *Config) AllowedImages() []string {
	var images []string
	for _, p := range c.Pools {
		images = append(images, p.Images...)
	}
	sort.Strings(images)
	return images
}

// ErrImageNotAllowed is returned by PoolFor for images that no pool serves.
var ErrImageNotAllowed = errors.New("image not allowed")

// PoolFor picks the pool serving image. An empty image goes to default_pool. Patterns use
// path.Match syntax, where "*" does not cross "/": "node:*" matches "node:22" but not
// "evil/node:22", so a pattern never widens to another registry or namespace by accident.
func (c *Config) PoolFor(image string) (string, error) {
	if image == "" {
		if c.DefaultPool == "" {
			return "", fmt.Errorf("%w: the job sets no image and no default_pool is configured", ErrImageNotAllowed)
		}
		return c.DefaultPool, nil
	}
	for _, p := range c.Pools {
		if matchesAny(p.Images, image) {
			return p.Name, nil
		}
	}
	allowed := c.AllowedImages()
	if len(allowed) == 0 {
		return "", fmt.Errorf("%w: %q: no pool serves any image; remove image: from the job to use default_pool", ErrImageNotAllowed, image)
	}
	return "", fmt.Errorf("%w: %q: allowed images are %s", ErrImageNotAllowed, image, strings.Join(allowed, ", "))
}

// Placement is where a job runs: a warm pool, or a cold start from a template (unknown_image =
// "cold"). Exactly one field is set.
type Placement struct {
	Pool         string
	ColdTemplate string
}

// Place picks where image runs: the pool serving it (PoolFor), else, with unknown_image = "cold",
// a cold start from cold_template if a cold_images pattern matches. An image allowed by neither
// is ErrImageNotAllowed, naming both lists.
func (c *Config) Place(image string) (Placement, error) {
	pool, err := c.PoolFor(image)
	if err == nil {
		return Placement{Pool: pool}, nil
	}
	if c.UnknownImage != UnknownImageCold || image == "" {
		return Placement{}, err
	}
	if matchesAny(c.ColdImages, image) {
		return Placement{ColdTemplate: c.ColdTemplate}, nil
	}
	cold := slices.Sorted(slices.Values(c.ColdImages))
	return Placement{}, fmt.Errorf("%w; cold starts (unknown_image = \"cold\") allow %s", err, strings.Join(cold, ", "))
}

// matchesAny reports whether image matches one of the patterns. Patterns use path.Match syntax,
// where "*" does not cross "/".
func matchesAny(patterns []string, image string) bool {
	for _, pattern := range patterns {
		if ok, _ := path.Match(pattern, image); ok {
			return true
		}
	}
	return false
}

func isDNSLabel(s string) bool { return len(validation.IsDNS1123Label(s)) == 0 }

func isDNSSubdomain(s string) bool { return len(validation.IsDNS1123Subdomain(s)) == 0 }
