package http

import (
	"net/netip"
	"syscall"
	"unsafe"
)

// poll collects ready events without blocking.
func (l *evloop) poll(ep int) int {
	r, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, uintptr(ep), uintptr(unsafe.Pointer(&l.events[0])), uintptr(len(l.events)), 0, 0, 0)
	if e != 0 {
		return 0
	}
	return int(r)
}

func sockaddrIP(sa syscall.Sockaddr) netip.Addr {
	switch a := sa.(type) {
	case *syscall.SockaddrInet4:
		return netip.AddrFrom4(a.Addr)
	case *syscall.SockaddrInet6:
		return netip.AddrFrom16(a.Addr).Unmap()
	}
	return netip.Addr{}
}

func rawRead(fd int, p []byte) (int, syscall.Errno) {
	r, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	return int(r), e
}

func rawWrite(fd int, p []byte) (int, syscall.Errno) {
	r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	return int(r), e
}
