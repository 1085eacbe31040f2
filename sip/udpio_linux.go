//go:build linux

package sip

import (
	"net"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// The UDP socket's two calls on the message path, sendto and recvmmsg, are
// made here as raw system calls through the socket's syscall.RawConn, which
// holds the descriptor open for the call and waits in the netpoller when the
// socket is not ready, as net's own calls do. What they leave out is the
// runtime's bookkeeping around a blocking system call (entersyscall and
// exitsyscall, and the monitor thread's hand-off of the processor of a
// thread seen in one): on a non-blocking socket neither call ever blocks,
// and with sluice pinned to one core that monitor thread competed with the
// message path for it (thousands of wake-ups a second at 2,000 calls/s,
// about a sixth of the CPU per call in bench/sip-cpu.sh). recvmmsg reads
// every datagram waiting, up to -sip-udp-batch (Config.UDPBatch), in one
// call; raw sendto is used only with -sip-udp-raw-send (DefaultUDPBatch
// says why).

// udpReadBuf is the size of each datagram buffer: larger than any UDP
// payload, so a datagram is never cut (an oversized one is answered 513
// from its head, tooLargeDatagram).
const udpReadBuf = 65536

// udpRaw sends on the UDP socket with raw sendto calls.
type udpRaw struct {
	rc   syscall.RawConn
	v6   bool      // the socket is AF_INET6: IPv4 peers as mapped addresses
	pool sync.Pool // *rawSend
}

// newUDPRaw returns the raw sender of c, or nil when its descriptor cannot
// be reached (then net's calls are used).
func newUDPRaw(c *net.UDPConn) *udpRaw {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil
	}
	dom := -1
	if err := rc.Control(func(fd uintptr) {
		dom, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DOMAIN)
	}); err != nil || dom != unix.AF_INET && dom != unix.AF_INET6 {
		return nil
	}
	u := &udpRaw{rc: rc, v6: dom == unix.AF_INET6}
	u.pool.New = func() any {
		r := new(rawSend)
		r.fn = r.do
		return r
	}
	return u
}

// rawSend is one sendto: its arguments and result, and the bound method
// RawConn.Write calls (bound once per pooled value, so a send allocates
// nothing).
type rawSend struct {
	p     []byte
	sa    unix.RawSockaddrInet6 // or a RawSockaddrInet4 in its first bytes
	salen uintptr
	errno syscall.Errno
	fn    func(fd uintptr) bool
}

func (r *rawSend) do(fd uintptr) bool {
	var e syscall.Errno
	for {
		_, _, e = syscall.RawSyscall6(unix.SYS_SENDTO, fd, uintptr(unsafe.Pointer(unsafe.SliceData(r.p))), uintptr(len(r.p)),
			0, uintptr(unsafe.Pointer(&r.sa)), r.salen)
		if e != syscall.EINTR {
			break
		}
	}
	if e == syscall.EAGAIN {
		return false // wait until writable
	}
	r.errno = e
	return true
}

// send writes the datagram p to dst. handled is false when this path cannot
// address dst (an IPv6 peer on an IPv4 socket): the caller then uses net's
// call, which gives the error net would.
func (u *udpRaw) send(p []byte, dst netip.AddrPort) (handled bool, err error) {
	if len(p) == 0 {
		return false, nil
	}
	r := u.pool.Get().(*rawSend)
	r.salen = uintptr(putSockaddr(&r.sa, u.v6, dst.Addr(), dst.Port()))
	if r.salen == 0 {
		u.pool.Put(r)
		return false, nil
	}
	r.p, r.errno = p, 0
	err = u.rc.Write(r.fn)
	if err == nil && r.errno != 0 {
		err = &net.OpError{Op: "write", Net: "udp", Addr: net.UDPAddrFromAddrPort(dst), Err: r.errno}
	}
	r.p = nil
	u.pool.Put(r)
	return true, err
}

// putSockaddr writes a, port into sa as a socket of the family v6 names
// addresses it (an IPv4 peer of an IPv6 socket as a mapped address) and
// returns its length; 0 when that socket cannot address a (an IPv6 peer
// of an IPv4 socket, an invalid address).
func putSockaddr(sa *unix.RawSockaddrInet6, v6 bool, a netip.Addr, port uint16) uint32 {
	switch {
	case !v6 && a.Unmap().Is4():
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		*sa4 = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: a.Unmap().As4()}
		putPort(&sa4.Port, port)
		return unix.SizeofSockaddrInet4
	case v6 && a.IsValid():
		*sa = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: a.As16()}
		putPort(&sa.Port, port)
		if z := a.Zone(); z != "" {
			if n, err := strconv.Atoi(z); err == nil {
				sa.Scope_id = uint32(n)
			} else if ifi, err := net.InterfaceByName(z); err == nil {
				sa.Scope_id = uint32(ifi.Index)
			}
		}
		return unix.SizeofSockaddrInet6
	}
	return 0
}

// putPort stores port in network byte order.
func putPort(dst *uint16, port uint16) {
	b := (*[2]byte)(unsafe.Pointer(dst))
	b[0], b[1] = byte(port>>8), byte(port)
}

// udpReader reads datagrams in batches with recvmmsg. It is used by one
// goroutine.
type udpReader struct {
	rc    syscall.RawConn
	bufs  [][]byte
	names []unix.RawSockaddrInet6
	iovs  []unix.Iovec
	hdrs  []unix.Mmsghdr
	n     int // datagrams of the last read
	errno syscall.Errno
	fn    func(fd uintptr) bool
}

// newUDPReader returns a reader of c that takes up to batch datagrams a
// call, or nil when its descriptor cannot be reached (then net's
// ReadFromUDPAddrPort is used).
func newUDPReader(c *net.UDPConn, batch int) *udpReader {
	rc, err := c.SyscallConn()
	if err != nil || batch < 1 {
		return nil
	}
	r := &udpReader{
		rc:    rc,
		bufs:  make([][]byte, batch),
		names: make([]unix.RawSockaddrInet6, batch),
		iovs:  make([]unix.Iovec, batch),
		hdrs:  make([]unix.Mmsghdr, batch),
	}
	for i := range r.bufs {
		r.bufs[i] = make([]byte, udpReadBuf)
		r.iovs[i].Base = &r.bufs[i][0]
		r.iovs[i].SetLen(udpReadBuf)
		r.hdrs[i].Hdr.Iov = &r.iovs[i]
		r.hdrs[i].Hdr.SetIovlen(1)
		r.hdrs[i].Hdr.Name = (*byte)(unsafe.Pointer(&r.names[i]))
	}
	r.fn = r.do
	return r
}

func (r *udpReader) do(fd uintptr) bool {
	for i := range r.hdrs {
		r.hdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet6
		r.hdrs[i].Hdr.Flags = 0
		r.hdrs[i].Len = 0
	}
	var n uintptr
	var e syscall.Errno
	for {
		n, _, e = syscall.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&r.hdrs[0])), uintptr(len(r.hdrs)),
			unix.MSG_DONTWAIT, 0, 0)
		if e != syscall.EINTR {
			break
		}
	}
	if e == syscall.EAGAIN {
		return false // wait until readable
	}
	r.n, r.errno = int(n), e
	if e != 0 {
		r.n = 0
	}
	return true
}

// read waits for at least one datagram and returns how many the buffers
// hold.
func (r *udpReader) read() (int, error) {
	r.n, r.errno = 0, 0
	if err := r.rc.Read(r.fn); err != nil {
		return 0, err
	}
	if r.errno != 0 {
		return 0, &net.OpError{Op: "read", Net: "udp", Err: r.errno}
	}
	return r.n, nil
}

// datagram returns the i-th datagram of the last read and its source (an
// invalid address when the kernel gave none it knows).
func (r *udpReader) datagram(i int) ([]byte, netip.AddrPort) {
	h := &r.hdrs[i]
	sa := &r.names[i]
	var from netip.AddrPort
	switch sa.Family {
	case unix.AF_INET:
		s4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		from = netip.AddrPortFrom(netip.AddrFrom4(s4.Addr), getPort(&s4.Port))
	case unix.AF_INET6:
		a := netip.AddrFrom16(sa.Addr)
		if sa.Scope_id != 0 {
			a = a.WithZone(strconv.FormatUint(uint64(sa.Scope_id), 10))
		}
		from = netip.AddrPortFrom(a, getPort(&sa.Port))
	}
	return r.bufs[i][:h.Len], from
}

// getPort reads a port in network byte order.
func getPort(p *uint16) uint16 {
	b := (*[2]byte)(unsafe.Pointer(p))
	return uint16(b[0])<<8 | uint16(b[1])
}

// rawBatch is the batchWriter of a send queue with raw sends on
// (udpbatch.go): sendmmsg as a raw system call through the socket's
// RawConn, for the reason raw sendto is (the monitor thread, above). It
// is used under the queue's lock, by one goroutine at a time.
type rawBatch struct {
	rc    syscall.RawConn
	v6    bool
	hdrs  []unix.Mmsghdr
	iovs  []unix.Iovec
	names []unix.RawSockaddrInet6 // or a RawSockaddrInet4 in its first bytes
	cur   []unix.Mmsghdr          // the headers of the call under way
	sent  int
	errno syscall.Errno
	fn    func(fd uintptr) bool
}

// newRawBatch returns the raw batch writer of u's socket, or nil without
// raw sends.
func newRawBatch(u *udpRaw) batchWriter {
	if u == nil {
		return nil
	}
	b := &rawBatch{rc: u.rc, v6: u.v6}
	b.fn = b.do
	return b
}

// WriteBatch sends ms with one sendmmsg (more when the socket takes fewer
// at once): the number sent, and the error of the message it stopped at
// when none was sent. A message whose address this socket cannot reach
// (an IPv6 peer on an IPv4 socket) fails with EAFNOSUPPORT, as the kernel
// would answer.
func (b *rawBatch) WriteBatch(ms []ipv4.Message, _ int) (int, error) {
	n := len(ms)
	if n == 0 {
		return 0, nil
	}
	for len(b.hdrs) < n {
		b.hdrs = append(b.hdrs, unix.Mmsghdr{})
		b.iovs = append(b.iovs, unix.Iovec{})
		b.names = append(b.names, unix.RawSockaddrInet6{})
	}
	for i := range n {
		m := &ms[i]
		h := &b.hdrs[i]
		*h = unix.Mmsghdr{}
		ua, _ := m.Addr.(*net.UDPAddr)
		salen := b.sockaddr(i, ua)
		if salen == 0 {
			if i == 0 {
				return 0, &net.OpError{Op: "write", Net: "udp", Addr: m.Addr, Err: syscall.EAFNOSUPPORT}
			}
			n = i // what comes before it leaves; the next call reports it
			break
		}
		var p []byte
		if len(m.Buffers) > 0 {
			p = m.Buffers[0]
		}
		b.iovs[i] = unix.Iovec{}
		if len(p) > 0 {
			b.iovs[i].Base = &p[0]
			b.iovs[i].SetLen(len(p))
		}
		h.Hdr.Iov = &b.iovs[i]
		h.Hdr.SetIovlen(1)
		h.Hdr.Name = (*byte)(unsafe.Pointer(&b.names[i]))
		h.Hdr.Namelen = salen
	}
	b.cur, b.sent, b.errno = b.hdrs[:n], 0, 0
	err := b.rc.Write(b.fn)
	b.cur = nil
	for i := range n {
		b.iovs[i] = unix.Iovec{} // no datagram kept reachable from here
	}
	if err != nil {
		return 0, err
	}
	if b.sent == 0 && b.errno != 0 {
		return 0, &net.OpError{Op: "write", Net: "udp", Addr: ms[0].Addr, Err: b.errno}
	}
	return b.sent, nil
}

func (b *rawBatch) do(fd uintptr) bool {
	hdrs := b.cur
	var n uintptr
	var e syscall.Errno
	for {
		n, _, e = syscall.RawSyscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&hdrs[0])), uintptr(len(hdrs)),
			unix.MSG_DONTWAIT, 0, 0)
		if e != syscall.EINTR {
			break
		}
	}
	if e == syscall.EAGAIN {
		return false // wait until writable
	}
	if e != 0 {
		b.sent, b.errno = 0, e
		return true
	}
	b.sent = int(n)
	return true
}

// sockaddr writes ua into names[i] for this socket's family and returns
// its length, 0 when the socket cannot address it.
func (b *rawBatch) sockaddr(i int, ua *net.UDPAddr) uint32 {
	if ua == nil {
		return 0
	}
	a, ok := netip.AddrFromSlice(ua.IP)
	if !ok {
		return 0
	}
	return putSockaddr(&b.names[i], b.v6, a.WithZone(ua.Zone), uint16(ua.Port))
}
