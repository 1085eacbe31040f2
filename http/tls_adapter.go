package http

import (
	"net"
	"time"
)

// recordConn is the net.Conn under a TLS connection's tls.Conn. It lets
// crypto/tls, unchanged, run on the loop engine: the handshake runs on a
// goroutine of its own over the socket (blocking mode, conn set), and once
// it is done the loop drives the record layer through memory (conn nil):
//
//   - Read gives tls.Conn the ciphertext the loop read from the socket
//     (feed), and when none is left it fails with errWouldBlock, a
//     net.Error whose Temporary() is true: crypto/tls keeps its state
//     after such an error (it records only other errors as permanent), so
//     the same tls.Conn goes on once the loop has fed more bytes.
//   - Write appends the records tls.Conn makes to out, which the loop
//     sends (take) as it sends a plain connection's bytes.
//
// A connection the loop hands to the fasthttp engine goes back to blocking
// mode over the socket (block), keeping the bytes still in memory. Only one
// goroutine uses a recordConn at a time: the handshake's, then the loop's,
// then fasthttp's.
type recordConn struct {
	in   []byte // ciphertext fed and not yet read: in[r:]
	r    int
	out  []byte // records written and not yet taken
	conn net.Conn
	// The addresses of the socket, for tls.Conn's LocalAddr and RemoteAddr.
	local, remote net.Addr
}

// wouldBlock is the error of a Read with no ciphertext in memory.
type wouldBlock struct{}

func (wouldBlock) Error() string   { return "tls record adapter: no ciphertext buffered (would block)" }
func (wouldBlock) Timeout() bool   { return true }
func (wouldBlock) Temporary() bool { return true }

// errWouldBlock is what recordConn.Read returns in memory mode when it has
// nothing to give.
var errWouldBlock net.Error = wouldBlock{}

// newRecordConn returns an adapter in blocking mode over c.
func newRecordConn(c net.Conn) *recordConn {
	return &recordConn{conn: c, local: c.LocalAddr(), remote: c.RemoteAddr()}
}

// Read returns buffered ciphertext, else reads the socket in blocking mode
// or fails with errWouldBlock in memory mode.
func (a *recordConn) Read(p []byte) (int, error) {
	if a.r < len(a.in) {
		n := copy(p, a.in[a.r:])
		a.r += n
		if a.r == len(a.in) {
			a.in, a.r = a.in[:0], 0
		}
		return n, nil
	}
	if a.conn != nil {
		return a.conn.Read(p)
	}
	return 0, errWouldBlock
}

// Write keeps p for the loop in memory mode; in blocking mode it writes
// what is kept first, then p.
func (a *recordConn) Write(p []byte) (int, error) {
	if a.conn == nil {
		a.out = append(a.out, p...)
		return len(p), nil
	}
	if len(a.out) > 0 {
		if _, err := a.conn.Write(a.out); err != nil {
			return 0, err
		}
		a.out = a.out[:0]
	}
	return a.conn.Write(p)
}

// feed appends ciphertext read from the socket.
func (a *recordConn) feed(p []byte) {
	if a.r == len(a.in) {
		a.in, a.r = a.in[:0], 0
	}
	a.in = append(a.in, p...)
}

// buffered reports the ciphertext fed and not yet read.
func (a *recordConn) buffered() int { return len(a.in) - a.r }

// take returns the records written since the last take; the slice is
// valid until the next Write.
func (a *recordConn) take() []byte {
	out := a.out
	a.out = a.out[:0]
	return out
}

// memory switches to memory mode: the socket is the loop's from now on.
func (a *recordConn) memory() { a.conn = nil }

// block switches to blocking mode over c (the socket, handed over).
func (a *recordConn) block(c net.Conn) { a.conn = c }

// Close closes the socket in blocking mode; in memory mode the loop closes
// it.
func (a *recordConn) Close() error {
	if a.conn != nil {
		return a.conn.Close()
	}
	return nil
}

func (a *recordConn) LocalAddr() net.Addr  { return a.local }
func (a *recordConn) RemoteAddr() net.Addr { return a.remote }

// The deadlines are the socket's in blocking mode; in memory mode the loop
// keeps its own (cconn.deadline) and these do nothing.
func (a *recordConn) SetDeadline(t time.Time) error {
	if a.conn != nil {
		return a.conn.SetDeadline(t)
	}
	return nil
}

func (a *recordConn) SetReadDeadline(t time.Time) error {
	if a.conn != nil {
		return a.conn.SetReadDeadline(t)
	}
	return nil
}

func (a *recordConn) SetWriteDeadline(t time.Time) error {
	if a.conn != nil {
		return a.conn.SetWriteDeadline(t)
	}
	return nil
}
