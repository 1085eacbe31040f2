package http

import (
	"encoding/binary"
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
//
// Read also follows the record framing of the bytes it gives tls.Conn
// (from the first byte of the connection, handshake included), so the loop
// can tell when tls.Conn holds nothing more (settled) without asking it
// once more per request: that Read finds no ciphertext, allocates, and at
// many connections touches cold per-connection state.
type recordConn struct {
	in   []byte // ciphertext fed and not yet read: in[r:]
	r    int
	out  []byte // records written and not yet taken
	conn net.Conn
	// The addresses of the socket, for tls.Conn's LocalAddr and RemoteAddr.
	local, remote net.Addr
	// The framing of the bytes given to tls.Conn: hn bytes of a record
	// header are in hdr (5: the header is complete and body bytes of the
	// record are still to come); ends counts the records whose last
	// byte was given since resetEnds.
	hdr  [recordHeaderLen]byte
	hn   int
	body int
	ends int
}

// recordHeaderLen is the length of a TLS record header: type, version and
// the length of the body (RFC 8446 §5.1).
const recordHeaderLen = 5

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
		a.track(p[:n])
		a.r += n
		if a.r == len(a.in) {
			a.in, a.r = a.in[:0], 0
		}
		return n, nil
	}
	if a.conn != nil {
		n, err := a.conn.Read(p)
		a.track(p[:max(n, 0)])
		return n, err
	}
	return 0, errWouldBlock
}

// track follows the record framing over p, the next bytes given to
// tls.Conn.
func (a *recordConn) track(p []byte) {
	for len(p) > 0 {
		if a.hn < recordHeaderLen {
			k := copy(a.hdr[a.hn:], p)
			a.hn += k
			p = p[k:]
			if a.hn == recordHeaderLen {
				a.body = int(binary.BigEndian.Uint16(a.hdr[3:]))
			}
		} else {
			k := min(a.body, len(p))
			a.body -= k
			p = p[k:]
		}
		if a.hn == recordHeaderLen && a.body == 0 {
			a.hn = 0
			a.ends++
		}
	}
}

// resetEnds starts counting the records given to tls.Conn anew.
func (a *recordConn) resetEnds() { a.ends = 0 }

// settled reports whether what tls.Conn was given since resetEnds is
// exactly one record, ending where the given bytes end. After a Read that
// returned plaintext without error and did not fill its buffer, tls.Conn
// then holds nothing: it decrypted that record (and any part of it given
// before), gave all of its plaintext, and was given nothing beyond it.
func (a *recordConn) settled() bool {
	return a.ends == 1 && a.hn == 0
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
