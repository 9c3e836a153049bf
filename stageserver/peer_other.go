//go:build !linux

package stageserver

import (
	"net"
	"os"
)

// checkPeer relies on the socket's directory and mode where the kernel does not name the peer.
func checkPeer(net.Conn) error { return nil }

// ownerOf is not known here: the directory's mode alone is checked.
func ownerOf(os.FileInfo) (int, bool) { return 0, false }
