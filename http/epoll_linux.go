package http

// The loop engine's system layer: epoll, the eventfd that wakes a loop,
// non-blocking sockets and raw reads and writes, over golang.org/x/sys/unix.
// Nothing here knows HTTP; the loop above calls these with descriptors it
// owns (see engine_loop.go for who owns what).

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Readiness as the loop asks for it and reads it. Connections are watched
// edge-triggered for both directions: the loop reads or writes until
// EAGAIN, then waits for the next edge.
const (
	connEvents = unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET
	evWritable = unix.EPOLLOUT
	evPeerShut = unix.EPOLLRDHUP | unix.EPOLLHUP | unix.EPOLLERR // no new edge follows: read on to EOF
	evReadable = unix.EPOLLIN | evPeerShut
	evConnDone = unix.EPOLLOUT | unix.EPOLLERR | unix.EPOLLHUP // a non-blocking connect finished, well or not
)

// poller is one loop's epoll instance and the eventfd that interrupts its
// wait. The epoll descriptor is also registered with Go's own poller (it
// is readable while events are ready), so that a loop with nothing to do
// parks its goroutine rather than its thread.
type poller struct {
	ep     int
	wakefd int
	events []unix.EpollEvent
	epFile *os.File        // ep, registered with Go's poller
	epRaw  syscall.RawConn // of epFile; nil when ep could not be registered
	pollFn func(fd uintptr) bool
	polled int
}

// open creates the epoll instance and the eventfd, and watches the
// eventfd and the listening socket lnfd. EPOLLEXCLUSIVE on the listener:
// one loop is woken per incoming connection, not all of them.
func (p *poller) open(lnfd int) error {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return err
	}
	wakefd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(ep)
		return err
	}
	p.ep, p.wakefd = ep, wakefd
	p.events = make([]unix.EpollEvent, 256)
	if err := unix.SetNonblock(ep, true); err == nil {
		f := os.NewFile(uintptr(ep), "epoll")
		if f.SetReadDeadline(time.Time{}) == nil { // pollable
			if rc, err := f.SyscallConn(); err == nil {
				p.epFile, p.epRaw = f, rc
				p.pollFn = func(fd uintptr) bool {
					p.polled = p.poll(int(fd))
					return p.polled > 0
				}
			}
		}
		if p.epRaw == nil {
			// os.NewFile owns ep now; a descriptor that is not pollable
			// stays usable through the File's Fd.
			p.epFile = f
			p.ep = int(f.Fd())
		}
	}
	if err := unix.EpollCtl(p.ep, unix.EPOLL_CTL_ADD, p.wakefd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(p.wakefd)}); err != nil {
		p.close()
		return err
	}
	if lnfd < 0 { // no plain listener: HTTPS only
		return nil
	}
	if err := unix.EpollCtl(p.ep, unix.EPOLL_CTL_ADD, lnfd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLEXCLUSIVE, Fd: int32(lnfd)}); err != nil {
		p.close()
		return err
	}
	return nil
}

// close closes the epoll instance and the eventfd.
func (p *poller) close() {
	if p.epFile != nil {
		p.epFile.Close() // leaves Go's poller and closes ep
	} else {
		unix.Close(p.ep)
	}
	unix.Close(p.wakefd)
}

// wait returns the number of ready events in p.events, or none after
// timeout. It polls without blocking first: under load events are almost
// always ready. When none are, it parks the goroutine on Go's own poller,
// in which the epoll descriptor is registered, so the P is free for other
// goroutines at once. A blocking epoll_wait would keep the P until sysmon
// takes it (20 µs to 10 ms later), holding up the rest of the process
// meanwhile (health checks, SIP, the admin server) and costing a thread
// switch back.
func (p *poller) wait(timeout time.Duration) (int, error) {
	if n := p.poll(p.ep); n > 0 {
		return n, nil
	}
	if p.epRaw == nil { // the descriptor could not join Go's poller
		return unix.EpollWait(p.ep, p.events, int(timeout/time.Millisecond))
	}
	p.epFile.SetReadDeadline(time.Now().Add(timeout))
	p.polled = 0
	if err := p.epRaw.Read(p.pollFn); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		return 0, err
	}
	return p.polled, nil
}

// poll collects ready events without blocking. It is a raw system call:
// it never blocks, so it need not tell the scheduler.
func (p *poller) poll(ep int) int {
	r, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(ep), uintptr(unsafe.Pointer(&p.events[0])), uintptr(len(p.events)), 0, 0, 0)
	if e != 0 {
		return 0
	}
	return int(r)
}

// signal makes the eventfd readable, which ends a wait.
func (p *poller) signal() {
	one := uint64(1)
	unix.Write(p.wakefd, (*[8]byte)(unsafe.Pointer(&one))[:])
}

// clearSignal reads the eventfd back to zero.
func (p *poller) clearSignal() {
	var buf [8]byte
	unix.Read(p.wakefd, buf[:])
}

// watch adds a connection's descriptor, edge-triggered for both directions.
func (p *poller) watch(fd int) error {
	return unix.EpollCtl(p.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: connEvents, Fd: int32(fd)})
}

// unwatch removes fd (a connection handed over, or the listener at shutdown).
func (p *poller) unwatch(fd int) {
	unix.EpollCtl(p.ep, unix.EPOLL_CTL_DEL, fd, nil)
}

// dupListener returns a descriptor of its own for the listening socket of
// tl, for the loops to accept on without Go's poller.
func dupListener(tl *net.TCPListener) (int, error) {
	rc, err := tl.SyscallConn()
	if err != nil {
		return -1, err
	}
	lnfd := -1
	var derr error
	if err := rc.Control(func(fd uintptr) {
		lnfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return -1, err
	}
	return lnfd, derr
}

// accept takes one connection from the listener lnfd, non-blocking, with
// Nagle off, and returns it with the client's address and port.
func accept(lnfd int) (int, netip.Addr, uint16, error) {
	fd, sa, err := unix.Accept4(lnfd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
	if err != nil {
		return -1, netip.Addr{}, 0, err
	}
	unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	return fd, sockaddrIP(sa), sockaddrPort(sa), nil
}

// sockaddrPort returns the port of sa.
func sockaddrPort(sa unix.Sockaddr) uint16 {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return uint16(a.Port)
	case *unix.SockaddrInet6:
		return uint16(a.Port)
	}
	return 0
}

// sockaddrIP returns the address of sa, unmapped from IPv4-in-IPv6.
func sockaddrIP(sa unix.Sockaddr) netip.Addr {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrFrom4(a.Addr)
	case *unix.SockaddrInet6:
		return netip.AddrFrom16(a.Addr).Unmap()
	}
	return netip.Addr{}
}

// localAuthority returns the local address of socket fd as host:port.
func localAuthority(fd int) string {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return "localhost"
	}
	var port int
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		port = a.Port
	case *unix.SockaddrInet6:
		port = a.Port
	}
	return netip.AddrPortFrom(sockaddrIP(sa), uint16(port)).String()
}

// resolve returns the socket address of a backend's host:port.
func resolve(addr string) (unix.Sockaddr, error) {
	a, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return nil, err
	}
	if ip4 := a.IP.To4(); ip4 != nil {
		return &unix.SockaddrInet4{Port: a.Port, Addr: [4]byte(ip4)}, nil
	}
	return &unix.SockaddrInet6{Port: a.Port, Addr: [16]byte(a.IP.To16())}, nil
}

// connect opens a non-blocking socket to sa with Nagle off. connecting is
// true while the connection is still being made (EINPROGRESS); its end is
// announced by evConnDone and read with connectResult.
func connect(sa unix.Sockaddr) (fd int, connecting bool, err error) {
	family := unix.AF_INET
	if _, ok := sa.(*unix.SockaddrInet6); ok {
		family = unix.AF_INET6
	}
	fd, err = unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, false, err
	}
	unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	err = unix.Connect(fd, sa)
	if err != nil && err != unix.EINPROGRESS {
		unix.Close(fd)
		return -1, false, err
	}
	return fd, err != nil, nil
}

// connectResult returns how a non-blocking connect on fd ended: nil when
// it is connected.
func connectResult(fd int) error {
	soerr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err == nil && soerr != 0 {
		err = unix.Errno(soerr)
	}
	return err
}

// closeFD closes a descriptor the loop owns.
func closeFD(fd int) { unix.Close(fd) }

// rawRead reads from a non-blocking descriptor. Raw: it never blocks, so
// it need not tell the scheduler, which saves that work per read.
func rawRead(fd int, p []byte) (int, unix.Errno) {
	r, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	return int(r), e
}

// rawWrite writes to a non-blocking descriptor, raw as rawRead.
func rawWrite(fd int, p []byte) (int, unix.Errno) {
	r, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	return int(r), e
}

// getsockname returns the local address of socket fd, unmapped.
func getsockname(fd int) (netip.AddrPort, error) {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return netip.AddrPort{}, err
	}
	return netip.AddrPortFrom(sockaddrIP(sa), sockaddrPort(sa)), nil
}
