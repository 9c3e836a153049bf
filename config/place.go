package config

import (
	"errors"
	"fmt"
	"path"
	"slices"
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

// ErrImageNotAllowed is returned by Place for images that it may run nowhere.
var ErrImageNotAllowed = errors.New("image not allowed")

// Placement is where a job runs: a warm pool, or a cold start from a template (unknown_image =
// "cold"). Exactly one of Pool and ColdTemplate is set.
type Placement struct {
	Pool         string
	ColdTemplate string
	// OtherTag: Pool takes the image only through serve_other_tags, so its pods run another tag
	// or digest of the image's repository; prepare warns in the job log which image runs.
	OtherTag bool
}

// Place picks where image runs, the exact image first:
//   - no image: default_pool, whose template's image the job takes;
//   - a pool listing the image (an exact reference, resolved as the runtime does: "node:22" is
//     "docker.io/library/node:22");
//   - a pool with serve_other_tags listing another tag of its repository (OtherTag);
//   - with unknown_image = "cold", a cold start of the image itself from cold_template if a
//     cold_images pattern matches (path.Match syntax, where "*" does not cross "/", so a pattern
//     never widens to another registry or namespace by accident).
//
// Anything else is ErrImageNotAllowed, one line naming the pools, the images they serve and the
// cold_images patterns.
func (c *Config) Place(image string) (Placement, error) {
	if image == "" {
		if c.DefaultPool == "" {
			return Placement{}, fmt.Errorf("%w: the job sets no image and no default_pool is configured", ErrImageNotAllowed)
		}
		return Placement{Pool: c.DefaultPool}, nil
	}
	if p := c.poolListing(image, SameImage, false); p != nil {
		return Placement{Pool: p.Name}, nil
	}
	if p := c.poolListing(image, sameRepository, true); p != nil {
		return Placement{Pool: p.Name, OtherTag: true}, nil
	}
	cold := c.UnknownImage == UnknownImageCold
	if cold && matchesAny(c.ColdImages, image) {
		return Placement{ColdTemplate: c.ColdTemplate}, nil
	}
	msg := fmt.Sprintf("%q: no pool runs it (%s)", image, c.servedImages())
	if cold {
		msg += fmt.Sprintf("; cold starts (unknown_image = \"cold\") allow %s", strings.Join(slices.Sorted(slices.Values(c.ColdImages)), ", "))
	}
	if c.DefaultPool != "" {
		msg += fmt.Sprintf("; remove image: from the job to run in default_pool %s", c.DefaultPool)
	}
	return Placement{}, fmt.Errorf("%w: %s", ErrImageNotAllowed, msg)
}

// poolListing is the first pool with an image that matches image, among the pools with
// serve_other_tags only if otherTags.
func (c *Config) poolListing(image string, match func(listed, image string) bool, otherTags bool) *Pool {
	for i, p := range c.Pools {
		if (!otherTags || p.ServeOtherTags) && slices.ContainsFunc(p.Images, func(listed string) bool { return match(listed, image) }) {
			return &c.Pools[i]
		}
	}
	return nil
}

// servedImages says which images each pool serves, for the refusal: "pool a serves x:1, pool b
// serves y:2 and its other tags".
func (c *Config) servedImages() string {
	var served []string
	for _, p := range c.Pools {
		if len(p.Images) == 0 {
			continue
		}
		line := "pool " + p.Name + " serves " + strings.Join(p.Images, ", ")
		if p.ServeOtherTags {
			line += " and other tags of it"
		}
		served = append(served, line)
	}
	if len(served) == 0 {
		return "no pool serves an image"
	}
	return strings.Join(served, "; ")
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
