package sip

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"os"
	"reflect"
	"sync"
	"time"
	"unsafe"
)

// A TLS connection waiting between messages costs what a TCP one costs
// plus the session's keys, instead of the session's read buffers and a
// deep reader stack. Between messages the reader first asks the session
// for what it already holds (plaintext, or whole records read along with
// the last message) without touching the socket (probeIdle: rawConn.Read
// answers errProbe while the connection is in state idleProbe). When the
// session holds nothing, the reader waits idleLinger for the socket itself
// (linger); when that passes in silence, it drops the session's emptied
// read buffers (releaseTLSBuffers) and hands the wait to a goroutine of
// its own (handOver, streamWait), which waits for the socket to become
// readable the way a TCP connection does (waitReadable: a shallow stack,
// no buffer) and then reads through the session again.

// errProbe is what the socket "returns" to a session read that only asks
// what the session holds: a temporary timeout, which crypto/tls passes up
// without failing the session (as it does a read deadline).
var errProbe error = probeError{}

type probeError struct{}

func (probeError) Error() string   { return "sip tls: nothing buffered" }
func (probeError) Timeout() bool   { return true }
func (probeError) Temporary() bool { return true }

// tlsReadFields are the offsets in tls.Conn of the buffers its reads keep
// after use: rawInput (records as read), input (plaintext not yet taken,
// a view of rawInput) and hand (handshake messages). crypto/tls keeps
// their arrays, the largest record or handshake message seen (the
// ClientHello: about 2 KiB with a post-quantum key share), for the life
// of the connection. ok is false when this Go's crypto/tls does not have
// them as expected: nothing is dropped then.
type tlsReadFields struct {
	raw, input, hand uintptr
	ok               bool
}

var tlsFields = sync.OnceValue(func() tlsReadFields {
	t := reflect.TypeFor[tls.Conn]()
	field := func(name string, want reflect.Type) (uintptr, bool) {
		f, ok := t.FieldByName(name)
		return f.Offset, ok && len(f.Index) == 1 && f.Type == want
	}
	buf, rd := reflect.TypeFor[bytes.Buffer](), reflect.TypeFor[bytes.Reader]()
	raw, ok1 := field("rawInput", buf)
	input, ok2 := field("input", rd)
	hand, ok3 := field("hand", buf)
	return tlsReadFields{raw: raw, input: input, hand: hand, ok: ok1 && ok2 && ok3}
})

// releaseTLSBuffers drops the read buffers of s when all of them are
// empty (nothing read and not yet used), so that a session waiting for
// its peer holds none; the next record read allocates what it needs.
// Only the goroutine that reads s may call it, between its reads (the
// buffers belong to the read side, which that goroutine alone uses). It
// reports whether they were dropped.
func releaseTLSBuffers(s *tls.Conn) bool {
	f := tlsFields()
	if !f.ok {
		return false
	}
	p := unsafe.Pointer(s)
	raw := (*bytes.Buffer)(unsafe.Add(p, f.raw))
	input := (*bytes.Reader)(unsafe.Add(p, f.input))
	hand := (*bytes.Buffer)(unsafe.Add(p, f.hand))
	if raw.Len() != 0 || input.Len() != 0 || hand.Len() != 0 {
		return false
	}
	*raw, *input, *hand = bytes.Buffer{}, bytes.Reader{}, bytes.Buffer{}
	return true
}

// heldRecord reports whether s holds bytes of a record (or a handshake
// message) not yet whole: read along with the last message, they keep
// the session's read buffer grown to the whole record (up to some 17 KiB,
// outside the partial-message budget) while the connection waits. Only
// the goroutine that reads s may call it, between its reads.
func heldRecord(s *tls.Conn) bool {
	f := tlsFields()
	if !f.ok {
		return false
	}
	p := unsafe.Pointer(s)
	return (*bytes.Buffer)(unsafe.Add(p, f.raw)).Len() != 0 || (*bytes.Buffer)(unsafe.Add(p, f.hand)).Len() != 0
}

// idleDeadline is the deadline of a wait between messages of an accepted
// connection whose probe (probeIdle) found nothing to read: dl, or the
// message timeout from now when the session holds part of a record
// (heldRecord), the wait then marked as holding bytes (idleBytes, so the
// bytes that complete it do not start the timeout again). A peer that
// sends the start of a record with its last message must not keep the
// grown buffer for the idle timeout; bytes that come during the wait
// start the same timeout (rawConn.Read).
func (c *tcpConn) idleDeadline(dl time.Time) time.Time {
	if c.sess == nil || !c.accepted || !heldRecord(c.sess) {
		return dl
	}
	c.waiting.Store(idleBytes)
	if m := time.Now().Add(c.srv.cfg.TCPMessageTimeout); m.Before(dl) {
		dl = m
		_ = c.c.SetReadDeadline(dl)
	}
	return dl
}

// probeIdle returns the first byte of the next message of a connection
// with a TLS session when the session holds it already, in a buffer from
// the pool; (nil, nil) when it holds nothing: the socket is to be waited
// on (linger, waitIdle).
func (c *tcpConn) probeIdle() ([]byte, error) {
	c.waiting.Store(idleProbe)
	n, err := c.sess.Read(c.one[:])
	c.waiting.Store(idleNot)
	if n == 0 && err == errProbe {
		return nil, nil
	}
	return c.firstByte(n, err)
}

// waitIdle waits for the socket of a connection with a TLS session to be
// readable on a shallow stack holding no buffer, then reads the first byte
// of the next message through the session (readAwake).
func (c *tcpConn) waitIdle() ([]byte, error) {
	if err := waitReadable(c); err != nil {
		return nil, err
	}
	return c.readAwake()
}

// idleLinger is how long a reader that has handled a connection's
// messages waits for the next one itself before a goroutine of its own
// takes the wait (streamWait): a connection that is busy (a trunk, a
// transaction's next message) keeps its reader and the reader's stack,
// without a goroutine started, a stack grown again and, over TLS, the
// session's read buffers allocated again for every message; one that
// falls silent costs a waiting goroutine's 2 KiB after it.
const idleLinger = 20 * time.Millisecond

// linger waits up to d, and not past dl (the read deadline in force), on
// the reader's own stack for tc's socket to be readable. True: it is (or
// the connection ended: the read that follows says so). False: nothing
// came, the wait is to be handed over; so it is at once when d is 0 or dl
// comes first. The read deadline is dl again on return.
func (c *tcpConn) linger(d time.Duration, dl time.Time) bool {
	until := time.Now().Add(d)
	if d <= 0 || !until.Before(dl) {
		return false
	}
	_ = c.c.SetReadDeadline(until)
	err := waitReadable(c)
	// dl again either way: the read that follows a wake-up at the end of
	// the linger must not meet its deadline before it starts.
	_ = c.c.SetReadDeadline(dl)
	return err == nil || !errors.Is(err, os.ErrDeadlineExceeded)
}

// readWoken reads the first bytes of the next message once the socket
// has them (after linger or waitReadable), in a buffer from the pool.
func (c *tcpConn) readWoken() ([]byte, error) {
	if c.sess != nil {
		return c.readAwake()
	}
	return readParked(c.c)
}

// readAwake reads the first byte of the next message through the TLS
// session once the socket has bytes, in a buffer from the pool (nil with
// an error and nothing read).
func (c *tcpConn) readAwake() ([]byte, error) {
	if c.waiting.Load() != idleBytes { // idleDeadline's: its timeout runs
		c.waiting.Store(idleWait)
	}
	n, err := c.sess.Read(c.one[:])
	if n > 0 || err == nil {
		c.waiting.Store(idleNot)
	}
	return c.firstByte(n, err)
}

// firstByte is what a one-byte session read gave: the byte in a buffer
// from the pool, or nil and an error.
func (c *tcpConn) firstByte(n int, err error) ([]byte, error) {
	if n <= 0 {
		if err == nil {
			err = io.ErrNoProgress
		}
		return nil, err
	}
	return append(getReadBuf(), c.one[0]), err
}
