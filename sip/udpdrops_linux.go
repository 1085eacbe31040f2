//go:build linux

package sip

import (
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// udpDrops returns the count of datagrams the kernel dropped at c's
// receive queue since the socket was made (SO_MEMINFO's SK_MEMINFO_DROPS:
// the queue was full), and whether it could read it.
func udpDrops(c *net.UDPConn) (uint32, bool) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, false
	}
	var info [unix.SK_MEMINFO_VARS]uint32
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		n := uint32(unsafe.Sizeof(info))
		_, _, errno = syscall.RawSyscall6(syscall.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_MEMINFO,
			uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&n)), 0)
	}); err != nil || errno != 0 {
		return 0, false
	}
	return info[unix.SK_MEMINFO_DROPS], true
}
