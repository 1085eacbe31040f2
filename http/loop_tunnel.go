//go:build linux

package http

import (
	"bytes"

	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"

	"github.com/sluicelb/sluice/accesslog"
	"github.com/sluicelb/sluice/lb"
)

// Tunnels on the loop engine. An upgrade request the allow-list takes
// (upgradeAsked) stays on the loop: it is admitted, picked and sent as
// any request, with Upgrade and "Connection: upgrade" put back after the
// hop-by-hop headers are removed. When the backend answers 101 with the
// Upgrade asked for (consume calls switchTunnel), the client and backend
// connections stay on the loop, both descriptors owned by it as before,
// and become a tunnel: no goroutine per tunnel, idle or not. Any other
// answer is relayed as HTTP and the client's connection goes on with its
// next request; the backend connection is not reused after an upgrade
// request.
//
// Each direction moves bytes through one buffer, the reading side's own
// (client: cconn.in, backend: bconn.in): it reads again only once what
// it read is written to the other side (the backend's pending request
// bytes, the client's pending answer bytes), so a side that does not
// read stops the other's reads and nothing grows. A side's EOF is passed
// on as shutdown(SHUT_WR) of the other once its bytes are written; the
// tunnel closes when both have ended, on any error, and after TunnelIdle
// without a byte either way (the client's deadline; the backend
// connection has none of its own). The backend connection never returns
// to its pool. On shutdown a tunnel is a busy client: the loop lets it
// run until the drain deadline, then closes it.

// loopUpgrade returns the Upgrade of a request head the loop may forward
// as an upgrade (a copy), or nil.
func (l *evloop) loopUpgrade(h *fasthttp.RequestHeader, bodyLen int) []byte {
	up := l.s.upgradeAsked(h, bodyLen <= 0)
	if up == nil {
		return nil
	}
	return bytes.Clone(up)
}

// untakeTunnel ends the request's count in TunnelsPending, once.
func (l *evloop) untakeTunnel(c *cconn) {
	if c.x.tunPending {
		c.x.tunPending = false
		l.s.stats.TunnelsPending.Add(-1)
	}
}

// switchTunnel turns the exchange of c with bc into a tunnel after the
// backend's 101 (its head is l.respH, hlen bytes at bc.in[bc.r:]).
func (l *evloop) switchTunnel(c *cconn, bc *bconn, hlen int) {
	s := l.s
	x := &c.x
	if s.endedByCritical(&x.plan) {
		l.abort(c)
		return
	}
	// A switch is a success for passive health; the tunnel is not an
	// outstanding request of the backend.
	x.status = fasthttp.StatusSwitchingProtocols
	x.gotHead = true
	x.releaseBackend(s.clock.Now(), lb.OK)
	head := s.switchHead(l.out[:0], &l.respH, &x.plan, x.upgrade, c.ip)
	l.out = head[:0]
	s.observe(&x.plan)
	// The source's count of backend connections (MaxConns/8) goes on for
	// the tunnel's life, which holds its backend connection: closeClient
	// ends it.
	l.untakeTunnel(c)
	s.stats.Tunnels.Add(1)
	s.stats.TunnelsTotal.Add(1)
	c.tun, bc.tun = true, true
	bc.deadline = 0
	c.deadline = l.now + int64(s.cfg.TunnelIdle)
	// The client's bytes after the request are the tunnel's.
	c.r += x.reqLen
	x.reqLen = 0
	bc.r += hlen
	l.writeClient(c, head)
	if c.fd < 0 {
		return
	}
	if bc.r < bc.w {
		x.log.tunOut += int64(bc.w - bc.r)
		l.writeClient(c, bc.in[bc.r:bc.w])
		if c.fd < 0 {
			return
		}
	}
	bc.r, bc.w = 0, 0
	// A tunnel keeps the small buffers (a large head grew them): they are
	// its windows, and an idle tunnel holds them.
	if len(bc.in) > backendInitBuf {
		bc.in = make([]byte, backendInitBuf)
	}
	if n := c.w - c.r; len(c.in) > clientInitBuf && n <= clientInitBuf {
		nb := l.getBuf()
		copy(nb, c.in[c.r:c.w])
		c.in, c.r, c.w = nb, 0, n
	}
	if c.tls != nil {
		// Records read with the request may hold the tunnel's first
		// bytes, decrypted into the connection's buffer while the
		// socket itself has nothing more: read them now.
		c.rready = true
	}
	l.tunToBackend(c)
	if c.fd >= 0 {
		l.tunToClient(bc)
	}
}

// tunClientEvent handles readiness of a tunnel's client connection.
func (l *evloop) tunClientEvent(c *cconn, ev uint32) {
	if ev&evWritable != 0 && c.o < len(c.out) {
		if !l.tunFlushClient(c) {
			return
		}
	}
	if ev&evReadable != 0 {
		c.rready = true
		c.tls.sawReadable()
		c.hup = c.hup || ev&evPeerShut != 0
		l.tunToBackend(c)
	}
}

// tunBackendEvent handles readiness of a tunnel's backend connection.
func (l *evloop) tunBackendEvent(bc *bconn, ev uint32) {
	c := bc.c
	if c == nil || c.fd < 0 {
		l.closeBackend(bc)
		return
	}
	if ev&evWritable != 0 {
		bc.wready = true
		if len(bc.pend) > 0 {
			l.tunToBackend(c)
			if c.fd < 0 {
				return
			}
		}
	}
	if ev&evReadable != 0 {
		bc.rready = true
		bc.hup = bc.hup || ev&evPeerShut != 0
		l.tunToClient(bc)
	}
}

// tunFlushClient writes the client's pending bytes; once they are out it
// reads the backend again. It reports whether the tunnel is still open.
func (l *evloop) tunFlushClient(c *cconn) bool {
	for c.o < len(c.out) {
		n, errno := rawWrite(c.fd, c.out[c.o:])
		switch {
		case errno == unix.EINTR:
			continue
		case errno == unix.EAGAIN:
			return true
		case errno != 0:
			l.closeClient(c)
			return false
		}
		c.o += n
	}
	c.out, c.o = c.out[:0], 0
	c.deadline = l.now + int64(l.s.cfg.TunnelIdle)
	if bc := c.x.bc; bc != nil {
		l.tunToClient(bc)
	}
	return c.fd >= 0
}

// tunToBackend moves the client's bytes to the backend: what is pending
// first, then reads, one buffer at a time.
func (l *evloop) tunToBackend(c *cconn) {
	bc := c.x.bc
	for c.fd >= 0 && bc != nil && bc.fd >= 0 {
		if len(bc.pend) > 0 {
			if !bc.wready {
				return // EPOLLOUT resumes
			}
			n, errno := rawWrite(bc.fd, bc.pend)
			switch {
			case errno == unix.EINTR:
				continue
			case errno == unix.EAGAIN:
				bc.wready = false
				return
			case errno != 0:
				c.x.log.end = accesslog.EndBackendReset
				l.closeClient(c)
				return
			}
			bc.pend = bc.pend[n:]
			c.x.log.tunIn += int64(n)
			l.tunTouch(c)
			continue
		}
		if c.r < c.w {
			bc.pend = c.in[c.r:c.w]
			c.r = c.w
			continue
		}
		c.r, c.w = 0, 0
		if c.tunEOF {
			if !bc.shutWr {
				bc.shutWr = true
				unix.Shutdown(bc.fd, unix.SHUT_WR)
			}
			l.tunMaybeDone(c)
			return
		}
		if !c.rready {
			return
		}
		// readClient: on an HTTPS connection the tunnel carries the
		// plaintext of the client's records, never the records (a
		// close_notify ends the client's side as a FIN does).
		if c.in == nil {
			c.in = l.getBuf()
		}
		n, errno := l.readClient(c, c.in)
		switch {
		case errno == unix.EAGAIN:
			c.rready = false
			return
		case errno == unix.EINTR:
			continue
		case errno != 0:
			l.closeClient(c)
			return
		case n == 0:
			c.tunEOF = true
			continue
		}
		if n < len(c.in) && !c.hup && c.tls == nil {
			// A short read drained the socket. Not so over TLS: one read
			// returns one record's plaintext, and more records may wait
			// in the connection's buffer without the socket being ready.
			c.rready = false
		}
		c.w = n
		l.tunTouch(c)
	}
}

// tunToClient moves the backend's bytes to the client, reading again
// only when the client has taken what was read before.
func (l *evloop) tunToClient(bc *bconn) {
	c := bc.c
	for c != nil && c.fd >= 0 && bc.fd >= 0 {
		if c.o < len(c.out) {
			return // the client's EPOLLOUT resumes (tunFlushClient)
		}
		if bc.tunEOF {
			if c.tls != nil && !c.tunNotified {
				// Over TLS the end of the backend's side is a
				// close_notify, written (and flushed, at the top of the
				// loop) before the FIN.
				c.tunNotified = true
				l.closeNotify(c)
				continue
			}
			if !c.shutWr {
				c.shutWr = true
				unix.Shutdown(c.fd, unix.SHUT_WR)
			}
			l.tunMaybeDone(c)
			return
		}
		if !bc.rready {
			return
		}
		n, errno := rawRead(bc.fd, bc.in)
		switch {
		case errno == unix.EAGAIN:
			bc.rready = false
			return
		case errno == unix.EINTR:
			continue
		case errno != 0:
			c.x.log.end = accesslog.EndBackendReset
			l.closeClient(c)
			return
		case n == 0:
			bc.tunEOF = true
			continue
		}
		if n < len(bc.in) && !bc.hup {
			bc.rready = false
		}
		c.x.log.tunOut += int64(n)
		l.tunTouch(c)
		// What the socket does not take waits in c.out (one buffer at
		// most), and the client has -http-client-timeout to take it.
		l.writeClient(c, bc.in[:n])
	}
}

// tunTouch records a byte moved: the tunnel is not idle. A client with
// answer bytes pending keeps the shorter deadline writeClient gave it.
func (l *evloop) tunTouch(c *cconn) {
	if c.o == len(c.out) {
		c.deadline = l.now + int64(l.s.cfg.TunnelIdle)
	}
}

// tunMaybeDone closes the tunnel once both sides have ended and every
// byte is written.
func (l *evloop) tunMaybeDone(c *cconn) {
	bc := c.x.bc
	if c.tunEOF && bc != nil && bc.tunEOF && len(bc.pend) == 0 && c.o == len(c.out) {
		c.x.log.tunDone = true
		l.closeClient(c)
	}
}

// tunClosed uncounts a tunnel whose client connection is closing.
func (l *evloop) tunClosed(c *cconn) {
	if c.tun {
		c.tun = false
		l.s.stats.Tunnels.Add(-1)
	}
}

// tunnelRefused answers an upgrade request over MaxTunnels.
func (l *evloop) tunnelRefused(c *cconn) {
	l.s.writeRefusal(&l.local, fasthttp.StatusServiceUnavailable, tunnelRetry, psTunnelLimit, "tunnels at their limit")
	l.answerLocal(c)
}
