//go:build linux

package http

import (
	"crypto/tls"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Backends over TLS on the loop engine. The loop reads and writes plain
// descriptors; for a TLS backend its descriptor is one end of a socket
// pair whose other end a goroutine pair bridges to a crypto/tls client
// connection (dialled, handshake within ConnectTimeout, certificate
// verified as Backend.TLS says). The loop code is the same for both
// kinds, tunnels included, and back pressure holds: each bridge
// direction copies through one window and the socket pair's buffers. A
// side's end goes on as the other's half-close (close_notify towards the
// backend). The cost is two goroutines and a socket pair per TLS backend
// connection (backend connections are pooled and bounded by
// -http-backend-max-conns, so they are few) and one more copy per byte;
// it was chosen over driving tls.Conn's record layer on the loop because
// the backend side carries no handshake flood to defend against and this
// needs no adapter. A dial or handshake that fails closes the bridge: the
// loop reads EOF before any answer byte, as from a backend that closed
// the connection (502, or the request moves on).

// tlsPoolKey is the loop's connPools key of a TLS backend address: its
// connections never serve the plain backend of the same address.
func tlsPoolKey(addr string) string { return "tls|" + addr }

// tlsBridge returns the loop's end of a socket pair bridged to a TLS
// connection to addr, dialled on a goroutine.
// linger bounds how long the bridge waits for the backend's end after
// the loop's. done runs when the bridge has ended and its connection to
// the backend is closed (or was never made); it is not run when tlsBridge
// returns an error.
func tlsBridge(addr string, cfg *tls.Config, timeout, linger time.Duration, pre []byte, done func()) (int, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return -1, err
	}
	f := os.NewFile(uintptr(fds[1]), "tls-bridge")
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		unix.Close(fds[0])
		return -1, err
	}
	go func() {
		defer done()
		bridgeTLS(nc, addr, cfg, timeout, linger, pre)
	}()
	return fds[0], nil
}

// bridgeTLS dials addr with TLS and copies between it and the loop's
// socket pair end nc until both directions end.
// pre (a PROXY header) is written before the TLS handshake.
func bridgeTLS(nc net.Conn, addr string, cfg *tls.Config, timeout, linger time.Duration, pre []byte) {
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: timeout}, Config: cfg}
	tc, err := dialTLSWith(d, addr, pre, timeout)
	if err != nil {
		nc.Close()
		return
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// The loop's end of its side goes on as close_notify. When the
		// loop closed the connection (peerClosed) the bridge ends at
		// once; after a tunnel's half-close the backend has linger to
		// end its side.
		if bridgeCopy(tc, nc) {
			if peerClosed(nc) {
				tc.Close() // the loop closed the connection: nothing more to wait for
			} else {
				tc.SetReadDeadline(time.Now().Add(linger))
			}
		}
	}()
	bridgeCopy(nc, tc) // the backend's close reaches the loop as EOF
	wg.Wait()
	nc.Close()
	tc.Close()
}

// bridgeCopy copies src to dst through one window. At src's end it shuts
// down dst's writing side and reports true; on an error it closes both.
func bridgeCopy(dst, src net.Conn) bool {
	buf := make([]byte, tunnelWindow)
	_, err := io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, buf)
	if err == nil && closeWrite(dst) == nil {
		return true
	}
	dst.Close()
	src.Close()
	return false
}

// peerClosed reports whether the loop closed its end of the socket pair
// (POLLHUP), rather than only shut down writing (a tunnel's half-close).
func peerClosed(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	hup := false
	rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, 0); err == nil && n > 0 {
			hup = fds[0].Revents&unix.POLLHUP != 0
		}
	})
	return hup
}

// dialTLSWith dials addr with d, writing pre (a PROXY header) on the TCP
// connection before the TLS handshake when it is set.
func dialTLSWith(d *tls.Dialer, addr string, pre []byte, timeout time.Duration) (net.Conn, error) {
	if len(pre) == 0 {
		return d.Dial("tcp", addr)
	}
	c, err := d.NetDialer.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write(pre); err != nil {
		c.Close()
		return nil, err
	}
	cfg := d.Config.Clone()
	if cfg.ServerName == "" {
		host, _, _ := net.SplitHostPort(addr)
		cfg.ServerName = host
	}
	tc := tls.Client(c, cfg)
	if err := tc.Handshake(); err != nil {
		c.Close()
		return nil, err
	}
	c.SetDeadline(time.Time{})
	return tc, nil
}
