//go:build linux

package http

import (
	"crypto/tls"
	"errors"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// The loop engine's HTTPS connections. The handshake ran off the loop
// (tls.go); the loop then owns the socket and the tls.Conn, and drives the
// record layer in memory through the connection's recordConn:
//
//   - reading (readClient): tls.Conn.Read is called until it has
//     plaintext; when it wants ciphertext (errWouldBlock) the loop reads
//     the socket into the recordConn and calls again, until the socket
//     has nothing more (EAGAIN). A record split anywhere across reads is
//     reassembled by crypto/tls, which keeps its state across
//     errWouldBlock (a Temporary net.Error).
//   - writing (writeClient, seal): plaintext goes through tls.Conn.Write,
//     which makes records in memory; they are written to the socket as a
//     plain connection's bytes are, the rest kept in cconn.out.
//
// No call blocks: the recordConn never touches the socket in memory mode.

// Sizes of an HTTPS connection's buffers on the loop.
const (
	// tlsReadBuf is the ciphertext read from the socket at once: a full
	// record (16 KiB of plaintext and its overhead).
	tlsReadBuf = 16<<10 + 512
	// maxTLSReadOut bounds the records a read makes tls.Conn write (alerts,
	// answers to key updates): a client that makes more without reading
	// is closed.
	maxTLSReadOut = 64 << 10
	// maxTLSPendingOut bounds the bytes a client that does not read may
	// leave unsent when the loop reads from it again (at most the end of
	// one answer otherwise): past it, a client sending records that demand
	// answers (key updates) or requests without reading the answers is
	// closed rather than buffered for.
	maxTLSPendingOut = 1 << 20
)

// loopTLS is an HTTPS connection's TLS state on the loop.
type loopTLS struct {
	conn *tls.Conn
	rc   *recordConn
	// starved: the last Read would block, so tls.Conn holds no plaintext
	// and no whole record; the next read starts at the socket (a Read
	// now would only block again, and crypto/tls allocates per call).
	starved bool
	// drained: the last read of the socket was short, so the kernel held
	// no more ciphertext then, and epoll (edge-triggered) has reported no
	// readiness since. Reading the socket again would only find EAGAIN:
	// a system call per request that a plain connection does not make
	// (its short read clears rready). Cleared by a readiness event
	// (sawReadable).
	drained bool
}

// midRecord reports whether crypto/tls was given part of a record and
// waits for the rest (false for a plain connection: t nil).
func (t *loopTLS) midRecord() bool { return t != nil && t.rc.hn > 0 }

// sawReadable records a readiness event of the socket: it may hold
// ciphertext again.
func (t *loopTLS) sawReadable() {
	if t != nil {
		t.drained = false
	}
}

// handedOver puts the connection back in blocking mode over nc (the same
// socket, handed to the fasthttp engine) and returns the TLS connection
// that engine reads plaintext from.
func (t *loopTLS) handedOver(nc net.Conn) net.Conn {
	t.rc.out = nil // it may be a loop's scratch
	t.rc.block(nc)
	return t.conn
}

// adoptTLS takes an HTTPS connection whose handshake is done to a loop:
// the loop gets a descriptor of its own for the socket, the rest of the
// records are read and written by the loop in memory.
func (e *loopEngine) adoptTLS(t *tlsFront, tc *tls.Conn, rc *recordConn, raw net.Conn, ip netip.Addr) {
	fd, err := socketFD(raw)
	raw.Close() // the loop's descriptor keeps the socket open
	if err != nil {
		e.s.logger.Warn("https: taking a connection to the loop failed", "err", err)
		e.s.conns.release(ip)
		t.pending.Add(-1)
		return
	}
	rc.memory()
	l := e.loops[int(e.next.Add(1)%uint32(len(e.loops)))]
	l.post(func() {
		defer t.pending.Add(-1)
		l.adopt(fd, ip, &loopTLS{conn: tc, rc: rc})
	})
}

// socketFD returns a descriptor of its own for c's socket (non-blocking,
// as Go made it).
func socketFD(c net.Conn) (int, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return -1, errors.New("not a socket")
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd, derr := -1, error(nil)
	if err := rc.Control(func(s uintptr) {
		fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return -1, err
	}
	return fd, derr
}

// adopt watches an HTTPS connection on the loop, as accept does a plain
// one, and reads at once: the handshake may have read the first request's
// records already, which no readiness edge would announce.
func (l *evloop) adopt(fd int, ip netip.Addr, t *loopTLS) {
	if l.e.stopping.Load() || l.stopped {
		closeFD(fd)
		l.s.conns.release(ip)
		return
	}
	c := &cconn{fd: fd, ip: ip, in: l.getBuf(), deadline: l.now + int64(l.s.cfg.ClientIdle), tls: t}
	if ta, ok := t.rc.remote.(*net.TCPAddr); ok {
		c.port = uint16(ta.Port)
	}
	if err := l.watch(fd); err != nil {
		closeFD(fd)
		l.s.conns.release(ip)
		return
	}
	l.setFD(fd, fdOwner{c: c})
	l.clients++
	c.rready = true
	l.clientIn(c)
}

// readClient reads request bytes from the client: the socket's, or on an
// HTTPS connection the plaintext of its records. It returns what rawRead
// returns: EAGAIN when nothing more is to be had now, 0 bytes and no
// error at the end, another error when the connection is broken (a TLS
// error: a record that does not decrypt, an alert, a close_notify).
func (l *evloop) readClient(c *cconn, p []byte) (int, unix.Errno) {
	t := c.tls
	if t == nil {
		return rawRead(c.fd, p)
	}
	rc := t.rc
	for {
		if len(c.out)-c.o > maxTLSPendingOut {
			return 0, unix.ENOBUFS
		}
		if !t.starved || rc.buffered() > 0 {
			n, errno, more := l.readRecords(c, p)
			// tls.Conn took all it was fed: the read buffer goes back
			// at once, so that the loop's connections share a few warm
			// buffers rather than hold one each while their requests are
			// at the backends.
			l.putTLSBuf(rc)
			if !more {
				return n, errno
			}
			t.starved = true
		}
		// tls.Conn holds no plaintext and no whole record: it needs
		// ciphertext from the socket. After a shutdown no new edge
		// comes: the EOF is still to be read.
		if t.drained && !c.hup {
			l.putTLSBuf(rc)
			return 0, unix.EAGAIN
		}
		if cap(rc.in) < tlsReadBuf {
			rc.in = l.getTLSBuf()
		}
		m, errno := rawRead(c.fd, rc.in[:cap(rc.in)])
		switch {
		case errno == unix.EINTR:
			continue
		case errno != 0:
			l.putTLSBuf(rc) // nothing buffered: an idle connection holds no read buffer
			return 0, errno
		case m == 0:
			return 0, 0
		}
		rc.in, rc.r = rc.in[:m], 0
		t.starved = false
		t.drained = m < cap(rc.in)
	}
}

// readRecords reads plaintext from c's tls.Conn and sends what reading
// made it write. more is true when it would block: it wants ciphertext.
func (l *evloop) readRecords(c *cconn, p []byte) (n int, errno unix.Errno, more bool) {
	t := c.tls
	rc := t.rc
	rc.out = l.tlsOut[:0]
	n, err := t.read(p)
	if out := rc.take(); len(out) > 0 { // an alert, an answer to a key update
		l.tlsOut = out[:0]
		rc.out = nil
		if len(out) > maxTLSReadOut {
			return 0, unix.EPROTO, false
		}
		l.writeRaw(c, out)
		if c.fd < 0 {
			return 0, unix.EPIPE, false
		}
	}
	rc.out = nil
	if n > 0 {
		return n, 0, false
	}
	if wouldBlockErr(err) {
		return 0, 0, true
	}
	if err == nil {
		return 0, unix.EPROTO, false // cannot happen: p is not empty
	}
	return 0, 0, false // EOF, close_notify, or a TLS error: the connection ends
}

// read reads plaintext from the TLS connection into p. When it returns
// plaintext and tls.Conn holds nothing more (recordConn.settled: it was
// given exactly the one record it decrypted, and p took all of that
// record's plaintext), t is starved at once: the next read starts at the
// socket rather than with a Read that would only block. That Read cost as
// much as a quarter of the record layer's work per keep-alive request (an
// allocation in crypto/tls, and per-connection state gone cold from the
// cache while the request was at the backend, at hundreds of
// connections).
func (t *loopTLS) read(p []byte) (int, error) {
	t.rc.resetEnds()
	n, err := t.conn.Read(p)
	if n > 0 {
		t.starved = err == nil && n < len(p) && t.rc.settled()
	}
	return n, err
}

// wouldBlockErr reports whether err is the record adapter's would-block
// error, which crypto/tls returns as it got it.
func wouldBlockErr(err error) bool {
	if _, ok := err.(wouldBlock); ok {
		return true
	}
	var wb wouldBlock
	return err != nil && errors.As(err, &wb)
}

// getTLSBuf returns an empty ciphertext read buffer of tlsReadBuf bytes,
// reused when one is free.
func (l *evloop) getTLSBuf() []byte {
	if n := len(l.tlsBufs); n > 0 {
		b := l.tlsBufs[n-1]
		l.tlsBufs = l.tlsBufs[:n-1]
		return b
	}
	return make([]byte, 0, tlsReadBuf)
}

// putTLSBuf takes rc's read buffer back when it holds nothing.
func (l *evloop) putTLSBuf(rc *recordConn) {
	if rc.buffered() == 0 && cap(rc.in) == tlsReadBuf && len(l.tlsBufs) < 1024 {
		l.tlsBufs = append(l.tlsBufs, rc.in[:0])
		rc.in, rc.r = nil, 0
	}
}

// seal returns p in TLS records for c; the records are valid until the
// next seal or read on the loop.
func (l *evloop) seal(c *cconn, p []byte) []byte {
	if len(p) == 0 {
		return nil
	}
	rc := c.tls.rc
	rc.out = l.tlsOut[:0]
	_, err := c.tls.conn.Write(p)
	out := rc.out
	rc.out = nil
	l.tlsOut = out[:0]
	if err != nil {
		l.closeClient(c)
		return nil
	}
	return out
}

// closeNotify writes the close_notify alert that ends what sluice sends on
// c, an HTTPS connection (a tunnel whose backend ended its side).
func (l *evloop) closeNotify(c *cconn) {
	rc := c.tls.rc
	rc.out = l.tlsOut[:0]
	err := c.tls.conn.CloseWrite()
	out := rc.out
	rc.out = nil
	l.tlsOut = out[:0]
	if err != nil {
		l.closeClient(c)
		return
	}
	l.writeRaw(c, out)
}
