//go:build unix

package sip

import (
	"errors"
	"net"
	"syscall"
)

// tryWrite makes one non-blocking write attempt on c and returns how much
// the socket took: 0 with a nil error when its buffer is full. It never
// waits for the peer, so a caller that relays for many connections (the
// UDP reader) is never held by one that does not read.
func tryWrite(c *net.TCPConn, p []byte) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var werr error
	err = rc.Write(func(fd uintptr) bool {
		for {
			n, werr = syscall.Write(int(fd), p)
			if !errors.Is(werr, syscall.EINTR) {
				return true // done, or would block: either way do not wait
			}
		}
	})
	if err != nil {
		return 0, err
	}
	if n < 0 {
		n = 0
	}
	if errors.Is(werr, syscall.EAGAIN) {
		werr = nil
	}
	return n, werr
}
