//go:build linux

package http

import (
	"io"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// unixPair is a connected pair of Unix stream sockets.
func unixPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// TestPeerClosed tells a socket pair end whose peer closed from one whose
// peer only shut down writing (the TLS bridge's question, loop engine).
func TestPeerClosed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		close func(c *net.UnixConn)
		want  bool
	}{
		{"closed", func(c *net.UnixConn) { c.Close() }, true},
		{"half-closed", func(c *net.UnixConn) { c.CloseWrite() }, false},
	} {
		a, b := unixPair(t)
		tc.close(b)
		io.ReadAll(a) // EOF, as the bridge sees it
		if got := peerClosed(a); got != tc.want {
			t.Errorf("%s: peerClosed %v, want %v", tc.name, got, tc.want)
		}
		a.Close()
		b.Close()
	}
}
