//go:build unix

package sip

import (
	"errors"
	"io"
	"net"
	"syscall"
)

// readParked waits for c to be readable holding no buffer, then reads into
// a buffer from the pool, which it returns with the bytes read (nil with an
// error and nothing read). A connection between messages therefore holds
// no read buffer while it waits; the read deadline applies as for Read.
func readParked(c *net.TCPConn) ([]byte, error) { return readParkedUpTo(c, tcpReadSize) }

// readParkedUpTo is readParked reading at most limit bytes (limit >= 1;
// at most tcpReadSize whatever limit): a reader bounded in what it may
// take (a WebSocket upgrade head) reads nothing past its bound.
func readParkedUpTo(c *net.TCPConn, limit int) ([]byte, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var b []byte
	var n int
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		b = getReadBuf()
		for {
			n, rerr = syscall.Read(int(fd), b[:min(limit, cap(b))])
			if !errors.Is(rerr, syscall.EINTR) {
				break
			}
		}
		if errors.Is(rerr, syscall.EAGAIN) {
			releaseReadBuf(b) // nothing yet: wait without it
			b = nil
			return false
		}
		return true
	})
	switch {
	case err != nil: // deadline, closed
	case rerr != nil:
		err = &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: rerr}
	case n <= 0:
		err = io.EOF
	}
	if err != nil {
		if b != nil {
			releaseReadBuf(b)
		}
		return nil, err
	}
	return b[:n], nil
}
