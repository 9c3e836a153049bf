//go:build !linux || !(amd64 || arm64)

package netfence

import (
	"errors"
	"runtime"
)

// Apply fails: the encoding is that of 64-bit little-endian Linux.
func Apply([]Rule) ([]Fenced, error) {
	return nil, errors.New("netfence programs Linux on amd64 or arm64 only, not " + runtime.GOOS + "/" + runtime.GOARCH + "; set the chart's jobDefaults.netstackFence.enabled=false")
}
