// Package buildinfo holds what the build stamps into every binary: the stage launcher and the
// executor must agree on it for the stage server to take a stage, and the launcher must not link
// the executor's dependencies to know it.
package buildinfo

// Version is set at build time (-ldflags "-X .../buildinfo.Version=...").
var Version = "dev"
