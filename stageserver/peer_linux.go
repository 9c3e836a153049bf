package stageserver

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// checkPeer admits a peer of this process's own user: the kernel says who is at the other end
// (SO_PEERCRED), whatever the socket's mode. Both ends check: the server serves only stages of
// its user (a stage of another user could neither have its files read nor its state written),
// and a stage hands its environment only to a server of its user.
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
	if self := uint32(os.Geteuid()); cred.Uid != self {
		return fmt.Errorf("uid %d (pid %d) at the other end is not this user (uid %d)", cred.Uid, cred.Pid, self)
	}
	return nil
}

// ownerOf is the uid that owns a file.
func ownerOf(info os.FileInfo) (int, bool) {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return int(st.Uid), true
}
