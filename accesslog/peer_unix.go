//go:build linux || darwin || freebsd

package accesslog

import (
	"net"
	"syscall"
)

// peerGone reports whether the receiver of a stream closed it: a syslog
// receiver sends nothing, so a peek that finds the end of the stream (0
// bytes) or an error other than "nothing yet" means it is gone. It does
// not block and reads nothing.
func peerGone(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	gone := false
	rc.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		gone = err == nil && n == 0 || err != nil && err != syscall.EAGAIN && err != syscall.EWOULDBLOCK && err != syscall.EINTR
		return true
	})
	return gone
}
