//go:build unix

package sip

import (
	"errors"
	"syscall"
)

// waitReadable waits, within the read deadline, until c's socket has
// bytes to read (or an end: the read that follows sees it), holding no
// buffer on a shallow stack. It peeks at one byte before it waits: the
// poller reports edges, and bytes already in the socket made theirs
// before. After the wait it does not look again: a wake-up without bytes
// (rare) leaves the read that follows to wait itself.
func waitReadable(c *tcpConn) error {
	rc, err := c.c.SyscallConn()
	if err != nil {
		return err
	}
	woke := false
	return rc.Read(func(fd uintptr) bool {
		if woke {
			return true
		}
		woke = true
		for {
			_, _, err := syscall.Recvfrom(int(fd), c.one[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			if !errors.Is(err, syscall.EINTR) {
				return !errors.Is(err, syscall.EAGAIN)
			}
		}
	})
}
