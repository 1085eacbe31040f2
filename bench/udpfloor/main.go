// Command udpfloor is the floor of a UDP SIP relay's CPU per call on a
// machine: a relay that does nothing but move datagrams, with the system
// calls sluice makes by default (recvmmsg of up to 16 datagrams a call,
// one sendmmsg of what a read produced, both as raw system calls through
// the socket's RawConn, so the runtime's poller waits when there is
// nothing to read). It parses nothing: what comes from the backend goes
// to the client, everything else goes to the backend. SIPp's uac sends
// every request of a call to the address it was given and its uas answers
// where a request came from, so a whole uac_rr/uas_rr call runs through
// it: INVITE, 180, 200, ACK, BYE, 200.
//
// It takes sluice's command line (bench/sip-cpu.sh starts it as BIN):
// -sip-listen and the first -sip-backend are read, every other argument
// is ignored. Not a proxy: it keeps one client (the last source that was
// not the backend) and one backend.
//
//	BIN=$(go build -o /tmp/udpfloor ./bench/udpfloor && echo /tmp/udpfloor) bench/sip-cpu.sh
package main

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

const batch = 16

func main() {
	var listen, backend string
	args := os.Args[1:]
	for i := 0; i < len(args)-1; i++ {
		switch args[i] {
		case "-sip-listen":
			listen = args[i+1]
		case "-sip-backend":
			if backend == "" {
				backend = args[i+1]
			}
		}
	}
	if listen == "" || backend == "" {
		fmt.Fprintln(os.Stderr, "udpfloor: -sip-listen ADDR and -sip-backend ADDR are needed")
		os.Exit(2)
	}
	be, err := netip.ParseAddrPort(backend)
	if err != nil || !be.Addr().Is4() {
		fmt.Fprintln(os.Stderr, "udpfloor: -sip-backend: an IPv4 address and port:", backend)
		os.Exit(2)
	}
	c, err := net.ListenPacket("udp4", listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "udpfloor:", err)
		os.Exit(1)
	}
	uc := c.(*net.UDPConn)
	uc.SetReadBuffer(4 << 20)
	uc.SetWriteBuffer(4 << 20)
	rc, err := uc.SyscallConn()
	if err != nil {
		fmt.Fprintln(os.Stderr, "udpfloor:", err)
		os.Exit(1)
	}
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		<-sig
		os.Exit(0)
	}()
	relay(rc, sockaddr(be))
}

func sockaddr(a netip.AddrPort) unix.RawSockaddrInet4 {
	sa := unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: a.Addr().As4()}
	p := (*[2]byte)(unsafe.Pointer(&sa.Port))
	p[0], p[1] = byte(a.Port()>>8), byte(a.Port())
	return sa
}

// relay reads batches and sends each batch's datagrams on, forever.
func relay(rc syscall.RawConn, backend unix.RawSockaddrInet4) {
	var (
		bufs   [batch][65536]byte
		names  [batch]unix.RawSockaddrInet4
		iovs   [batch]unix.Iovec
		hdrs   [batch]unix.Mmsghdr
		out    [batch]unix.Mmsghdr
		outIov [batch]unix.Iovec
		dests  [batch]unix.RawSockaddrInet4
		client unix.RawSockaddrInet4
		n, m   int
	)
	for i := range hdrs {
		iovs[i].Base = &bufs[i][0]
		iovs[i].SetLen(len(bufs[i]))
		hdrs[i].Hdr.Iov = &iovs[i]
		hdrs[i].Hdr.SetIovlen(1)
		hdrs[i].Hdr.Name = (*byte)(unsafe.Pointer(&names[i]))
	}
	read := func(fd uintptr) bool {
		for i := range hdrs {
			hdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet4
			hdrs[i].Len = 0
		}
		r, _, e := syscall.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&hdrs[0])), batch, unix.MSG_DONTWAIT, 0, 0)
		if e == syscall.EAGAIN {
			return false
		}
		n = 0
		if e == 0 {
			n = int(r)
		}
		return true
	}
	write := func(fd uintptr) bool {
		r, _, e := syscall.RawSyscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&out[0])), uintptr(m), unix.MSG_DONTWAIT, 0, 0)
		if e == syscall.EAGAIN {
			return false
		}
		if e == 0 && int(r) < m {
			copy(out[:], out[r:m]) // the rest in the next call
			m -= int(r)
			return false
		}
		return true
	}
	for {
		if err := rc.Read(read); err != nil {
			fmt.Fprintln(os.Stderr, "udpfloor:", err)
			os.Exit(1)
		}
		m = 0
		for i := range n {
			dests[m] = backend
			if names[i].Addr == backend.Addr && names[i].Port == backend.Port {
				dests[m] = client
			} else {
				client = names[i]
			}
			outIov[m].Base = &bufs[i][0]
			outIov[m].SetLen(int(hdrs[i].Len))
			out[m] = unix.Mmsghdr{}
			out[m].Hdr.Iov = &outIov[m]
			out[m].Hdr.SetIovlen(1)
			out[m].Hdr.Name = (*byte)(unsafe.Pointer(&dests[m]))
			out[m].Hdr.Namelen = unix.SizeofSockaddrInet4
			m++
		}
		if m > 0 {
			if err := rc.Write(write); err != nil {
				fmt.Fprintln(os.Stderr, "udpfloor:", err)
				os.Exit(1)
			}
		}
	}
}
