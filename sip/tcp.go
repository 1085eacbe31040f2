package sip

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"sync"
	"time"
)

// tcpConn is one TCP connection, accepted or dialled. Writes are serialized
// by mu; one goroutine reads.
type tcpConn struct {
	c      *net.TCPConn
	remote netip.AddrPort
	mu     sync.Mutex
}

func (c *tcpConn) write(p []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	_ = c.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err := c.c.Write(p)
	return err
}

// tcpTable maps remote addresses to live connections.
type tcpTable struct {
	mu      sync.RWMutex
	conns   map[netip.AddrPort]*tcpConn
	dialing map[netip.AddrPort][][]byte // messages waiting for the connection
}

func (t *tcpTable) init() {
	t.conns = map[netip.AddrPort]*tcpConn{}
	t.dialing = map[netip.AddrPort][][]byte{}
}

func (t *tcpTable) get(a netip.AddrPort) *tcpConn {
	t.mu.RLock()
	c := t.conns[a]
	t.mu.RUnlock()
	return c
}

func (t *tcpTable) remove(c *tcpConn) {
	t.mu.Lock()
	if t.conns[c.remote] == c {
		delete(t.conns, c.remote)
	}
	t.mu.Unlock()
}

func (t *tcpTable) len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.conns)
}

func (t *tcpTable) closeAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range t.conns {
		c.c.Close()
	}
}

func (s *Server) serveTCP() {
	defer s.wg.Done()
	for {
		c, err := s.tcpLn.AcceptTCP()
		if err != nil {
			if s.closed.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			s.log.Warn("sip tcp accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if s.tcp.len() >= s.cfg.TCPMaxConns {
			s.metrics.TCPRefused.Add(1)
			c.Close()
			continue
		}
		s.startConn(c)
	}
}

func (s *Server) startConn(c *net.TCPConn) *tcpConn {
	return s.startConnQueued(c, netip.AddrPort{})
}

// startConnQueued registers c and starts its reader. When dialled is
// valid, the messages queued for it by dialAsync are written first, before
// any other writer can reach the connection, so they keep their order.
func (s *Server) startConnQueued(c *net.TCPConn, dialled netip.AddrPort) *tcpConn {
	ra := c.RemoteAddr().(*net.TCPAddr).AddrPort()
	tc := &tcpConn{c: c, remote: netip.AddrPortFrom(ra.Addr().Unmap(), ra.Port())}
	tc.mu.Lock()
	s.tcp.mu.Lock()
	s.tcp.conns[tc.remote] = tc
	var q [][]byte
	if dialled.IsValid() {
		q = s.tcp.dialing[dialled]
		delete(s.tcp.dialing, dialled)
	}
	s.tcp.mu.Unlock()
	if s.closed.Load() {
		c.Close()
	}
	s.wg.Add(1)
	go s.readConn(tc)
	for _, m := range q {
		_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(m); err != nil {
			s.metrics.SendErrors.Add(1)
			break
		}
	}
	tc.mu.Unlock()
	return tc
}

// maxPending bounds the messages queued for a connection being dialled.
const maxPending = 64

// dialAsync opens a connection to a without blocking the caller. p, if not
// nil, is sent once the connection is up (with anything else queued for a
// meanwhile); nil only opens it. It reports whether p was queued.
func (s *Server) dialAsync(a netip.AddrPort, p []byte) bool {
	s.tcp.mu.Lock()
	if s.tcp.conns[a] != nil || s.closed.Load() {
		s.tcp.mu.Unlock()
		return false
	}
	q, dialing := s.tcp.dialing[a]
	if p != nil && len(q) < maxPending {
		q = append(q, append([]byte(nil), p...))
	}
	s.tcp.dialing[a] = q
	queued := p != nil && len(q) > 0 && len(q) <= maxPending
	s.tcp.mu.Unlock()
	if dialing {
		return queued
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		d := net.Dialer{Timeout: 2 * time.Second}
		c, err := d.DialContext(s.ctx, "tcp", a.String())
		if err != nil {
			s.tcp.mu.Lock()
			q := s.tcp.dialing[a]
			delete(s.tcp.dialing, a)
			s.tcp.mu.Unlock()
			s.log.Debug("sip tcp dial", "addr", a.String(), "err", err)
			s.metrics.SendErrors.Add(uint64(len(q)))
			return
		}
		s.startConnQueued(c.(*net.TCPConn), a)
	}()
	return queued
}

// readConn frames messages by Content-Length (RFC 3261 §18.3) across
// partial reads and hands each to handleDatagram. A framing error is
// answered with 400 when possible and closes the connection; so does
// silence longer than TCPIdleTimeout.
func (s *Server) readConn(tc *tcpConn) {
	defer s.wg.Done()
	defer func() {
		s.tcp.remove(tc)
		tc.c.Close()
	}()
	src := source{addr: tc.remote, conn: tc}
	buf := make([]byte, 0, 4096)
	chunk := make([]byte, 32*1024)
	for {
		_ = tc.c.SetReadDeadline(time.Now().Add(s.cfg.TCPIdleTimeout))
		n, err := tc.c.Read(chunk)
		if n > 0 {
			buf = append(buf, chunk[:n]...)
			for {
				// RFC 5626 §3.5.1 keep-alive: CRLFCRLF is answered with CRLF;
				// stray CRLFs between messages are skipped.
				if len(buf) >= 4 && string(buf[:4]) == "\r\n\r\n" {
					_ = tc.write([]byte("\r\n"))
					buf = buf[:copy(buf, buf[4:])]
					continue
				}
				skip := 0
				for skip+1 < len(buf) && buf[skip] == '\r' && buf[skip+1] == '\n' {
					skip += 2
				}
				if skip > 0 && skip+2 <= len(buf) {
					buf = buf[:copy(buf, buf[skip:])]
				}
				size, ok, ferr := frame(buf, s.cfg.MaxMessage)
				if ferr != nil {
					s.malformed(buf, src, "framing")
					return
				}
				if !ok {
					break
				}
				s.handleDatagram(buf[:size], src)
				buf = buf[:copy(buf, buf[size:])]
			}
			if cap(buf) > 256*1024 && len(buf) < 4096 {
				buf = append(make([]byte, 0, 4096), buf...)
			}
		}
		if err != nil {
			return
		}
	}
}

var errFrame = errors.New("bad framing")

// frame returns the size of the first complete message in b: headers up to
// the blank line plus Content-Length bytes of body. ok is false while more
// bytes are needed. A missing or malformed Content-Length, or a message
// over max, is an error: a stream has no other boundary to resync on.
func frame(b []byte, max int) (size int, ok bool, err error) {
	end := bytes.Index(b, []byte("\r\n\r\n"))
	if end < 0 {
		if len(b) > max {
			return 0, false, errFrame
		}
		return 0, false, nil
	}
	hdr := b[:end+2]
	cl := -1
	for len(hdr) > 0 {
		i := bytes.Index(hdr, []byte("\r\n"))
		line := hdr[:i]
		hdr = hdr[i+2:]
		name, val, found := bytes.Cut(line, []byte(":"))
		if !found {
			continue
		}
		name = bytes.TrimSpace(name)
		if bytes.EqualFold(name, []byte("content-length")) || bytes.EqualFold(name, []byte("l")) {
			n, ok := parseDigits(bytes.TrimSpace(val), max)
			if !ok {
				return 0, false, errFrame
			}
			cl = n
		}
	}
	if cl < 0 {
		return 0, false, errFrame
	}
	size = end + 4 + cl
	if size > max {
		return 0, false, errFrame
	}
	if len(b) < size {
		return 0, false, nil
	}
	return size, true, nil
}

// parseDigits parses a decimal number of at most limit.
func parseDigits(b []byte, limit int) (int, bool) {
	if len(b) == 0 || len(b) > 9 {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, n <= limit
}
