package stageserver

import (
	"errors"
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// checkPeer admits a peer of the server's own user, or root: the kernel says who connected
// (SO_PEERCRED), whatever the socket's mode.
func checkPeer(conn net.Conn) error {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return errors.New("not a Unix socket")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) { cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return err
	}
	if credErr != nil {
		return fmt.Errorf("reading the peer's credentials: %w", credErr)
	}
	if self := uint32(os.Geteuid()); cred.Uid != self && cred.Uid != 0 {
		return fmt.Errorf("uid %d (pid %d) is not the server's user (uid %d)", cred.Uid, cred.Pid, self)
	}
	return nil
}
