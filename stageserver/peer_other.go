//go:build !linux

package stageserver

import "net"

// checkPeer relies on the socket's directory and mode where the kernel does not name the peer.
func checkPeer(net.Conn) error { return nil }
