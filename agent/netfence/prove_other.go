//go:build !linux || !(amd64 || arm64)

package netfence

import (
	"errors"
	"io"
	"runtime"
)

// runtimeProbes proves nothing: the probes are Linux's system calls.
func runtimeProbes() probeReport {
	return probeReport{Unproven: []string{"the probes run on Linux on amd64 or arm64 only, not " + runtime.GOOS + "/" + runtime.GOARCH}}
}

func runProbeRole(string, io.Writer) error {
	return errors.New("the probes run on Linux on amd64 or arm64 only, not " + runtime.GOOS + "/" + runtime.GOARCH)
}
