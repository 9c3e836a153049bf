package config

import "strings"

// imageRef is an image reference as the container runtime resolves it: "node:22" and
// "docker.io/library/node:22" are one image, and a reference with neither tag nor digest means
// its "latest" tag. Comparing resolved references keeps an exact match exact without making an
// admin list every spelling of the image a pool's template runs.
type imageRef struct {
	repository string // registry host and path, e.g. docker.io/library/node
	version    string // ":tag", "@digest" or ":tag@digest"
}

// parseImageRef resolves ref the way Docker Hub's short names are resolved. It does not validate:
// checkPools refuses what cannot be an image reference before any job is placed.
func parseImageRef(ref string) imageRef {
	name, digest, _ := strings.Cut(ref, "@")
	var tag string
	// A tag follows the last colon after the last slash; an earlier colon is a registry's port.
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name, tag = name[:i], name[i+1:]
	}
	domain, rest, found := strings.Cut(name, "/")
	if !found || (!strings.ContainsAny(domain, ".:") && domain != "localhost") {
		domain, rest = "docker.io", name
	}
	if domain == "index.docker.io" {
		domain = "docker.io"
	}
	if domain == "docker.io" && !strings.Contains(rest, "/") {
		rest = "library/" + rest
	}
	r := imageRef{repository: domain + "/" + rest}
	switch {
	case tag == "" && digest == "":
		r.version = ":latest"
	case tag != "":
		r.version = ":" + tag
	}
	if digest != "" {
		r.version += "@" + digest
	}
	return r
}

// SameImage reports whether two references name the same image: equal once resolved
// ("node:22" is "docker.io/library/node:22"), tag and digest included.
func SameImage(a, b string) bool { return parseImageRef(a) == parseImageRef(b) }

// sameRepository reports whether two references name tags of one repository.
func sameRepository(a, b string) bool {
	return parseImageRef(a).repository == parseImageRef(b).repository
}

// isImagePattern reports whether s has path.Match's special characters.
func isImagePattern(s string) bool { return strings.ContainsAny(s, "*?[]\\") }

// imageRefProblem says why s, not a pattern, cannot be an exact image reference, or "".
func imageRefProblem(s string) string {
	switch {
	case s == "":
		return "is empty"
	case strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return "has a space or control character"
	case strings.HasSuffix(s, ":") || strings.HasSuffix(s, "@") || strings.HasPrefix(s, "/"):
		return "is not an image reference"
	}
	return ""
}
