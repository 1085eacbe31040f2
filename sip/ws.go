package sip

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gobwas/ws"
)

// SIP over WebSocket (RFC 7118). The handshake is gobwas/ws's Upgrader, fed
// the request head we read ourselves (bounded, within the handshake
// timeout): it must offer the subprotocol "sip" and is answered with
// exactly "sip"; Config.WSPath and Config.WSOrigins, when set, must match.
// Frames are read and written here, one SIP message per WebSocket message
// (text or binary, fragmented or not), parsed by sipgo as any other. A
// message over MaxMessage closes the connection with 1009, a protocol
// error with 1002; Ping is answered with Pong and Close echoed. The
// CRLFCRLF keep-alive in a message of its own is answered with CRLF.

// wsMaxHead bounds the handshake request head (request line and headers).
const wsMaxHead = 4096

// wsMaxHeader is the largest frame header: 2 bytes, 8 of length, 4 of mask.
const wsMaxHeader = 14

// wsLinger bounds the wait for the peer's own close after we sent a Close
// frame, so it reads our Close before a reset.
const wsLinger = time.Second

// errWSProtocol is a frame RFC 6455 forbids.
var errWSProtocol = errors.New("websocket protocol error")

// wsFrame is the header of a frame read from a client.
type wsFrame struct {
	fin    bool
	op     ws.OpCode
	masked bool
	mask   [4]byte
	length int64
}

// parseWSHeader parses the frame header at the start of b. n is the
// header's size, 0 while b holds less than the whole header. A header
// with reserved bits (no extension is negotiated), a reserved opcode, a
// fragmented or long control frame or a 64-bit length with the top bit
// set is errWSProtocol.
func parseWSHeader(b []byte) (f wsFrame, n int, err error) {
	if len(b) < 2 {
		return f, 0, nil
	}
	f.fin = b[0]&0x80 != 0
	if b[0]&0x70 != 0 {
		return f, 0, errWSProtocol
	}
	f.op = ws.OpCode(b[0] & 0x0f)
	if f.op.IsReserved() {
		return f, 0, errWSProtocol
	}
	f.masked = b[1]&0x80 != 0
	n = 2
	switch l := b[1] & 0x7f; l {
	case 126:
		n += 2
	case 127:
		n += 8
	default:
		f.length = int64(l)
	}
	if f.masked {
		n += 4
	}
	if len(b) < n {
		return f, 0, nil
	}
	switch b[1] & 0x7f {
	case 126:
		f.length = int64(binary.BigEndian.Uint16(b[2:4]))
	case 127:
		u := binary.BigEndian.Uint64(b[2:10])
		if u>>63 != 0 {
			return f, 0, errWSProtocol
		}
		f.length = int64(u)
	}
	if f.masked {
		copy(f.mask[:], b[n-4:n])
	}
	if f.op.IsControl() && (!f.fin || f.length > 125) {
		return f, 0, errWSProtocol
	}
	return f, n, nil
}

// appendWSHeader appends the header of an unmasked final frame of op
// carrying n bytes (what a server sends, RFC 6455 §5.1).
func appendWSHeader(b []byte, op ws.OpCode, n int) []byte {
	b = append(b, 0x80|byte(op))
	switch {
	case n < 126:
		return append(b, byte(n))
	case n <= 0xffff:
		return append(b, 126, byte(n>>8), byte(n))
	}
	return binary.BigEndian.AppendUint64(append(b, 127), uint64(n))
}

// wsOpFor is the opcode a SIP message goes in: text when it is valid
// UTF-8 (a browser fails a text frame that is not), else binary.
func wsOpFor(p []byte) ws.OpCode {
	if utf8.Valid(p) {
		return ws.OpText
	}
	return ws.OpBinary
}

// sendFrame writes one frame of op with payload p, in one write.
func (c *tcpConn) sendFrame(op ws.OpCode, p []byte) error {
	b := bufPool.Get().(*bytes.Buffer)
	b.Reset()
	b.Grow(wsMaxHeader + len(p))
	var h [wsMaxHeader]byte
	b.Write(appendWSHeader(h[:0], op, len(p)))
	b.Write(p)
	err := c.sendStream(b.Bytes())
	bufPool.Put(b)
	return err
}

// wsRejected is a handshake refused with an HTTP status.
func wsRejected(code int, reason string) error {
	return ws.RejectConnectionError(ws.RejectionStatus(code), ws.RejectionReason(reason))
}

// handshakeWS runs the TLS handshake (WSS) and the WebSocket handshake of
// tc within the gate and the handshake timeout. It returns the bytes read
// past the request head (frames sent without waiting for our answer) in a
// pooled buffer (nil when none), and false when the connection is to be
// closed.
//
// A WSS connection takes its place of the gate once its ClientHello is in
// (beginHandshake) and holds it through TLS and the upgrade. A plain WS
// connection takes it once its upgrade request head is in, to its blank
// line, and holds it while the head is checked and answered: before, it
// holds a socket, a parked goroutine and the bytes it sent (at most
// wsMaxHead), bounded by the connection limits and the handshake
// deadline, so silent or trickling WebSockets take no place from the
// node's TLS and WebSocket clients (HTTPS's included).
func (s *Server) handshakeWS(tc *tcpConn) ([]byte, bool) {
	var head []byte
	var end int
	var ok bool
	if tc.sess != nil {
		if !s.beginHandshake(tc) {
			return nil, false
		}
		defer s.endHandshake(tc)
		if err := tc.sess.Handshake(); err != nil {
			s.handshakeFailed(tc, err)
			return nil, false
		}
		if head, end, ok = s.readWSHead(tc); !ok {
			return nil, false
		}
	} else {
		s.handshakeDeadline(tc)
		if head, end, ok = s.readWSHead(tc); !ok {
			return nil, false
		}
		if !s.takeHandshake(tc) {
			return nil, false
		}
		defer s.endHandshake(tc)
	}
	offered, originSeen := false, false
	u := ws.Upgrader{
		ProtocolCustom: func(v []byte) (string, bool) {
			for _, p := range bytes.Split(v, []byte(",")) {
				if string(bytes.TrimSpace(p)) == "sip" {
					offered = true
					return "sip", true
				}
			}
			return "", true
		},
		OnRequest: func(uri []byte) error {
			if s.cfg.WSPath == "" {
				return nil
			}
			path, _, _ := bytes.Cut(uri, []byte("?"))
			if string(path) != s.cfg.WSPath {
				return wsRejected(http.StatusNotFound, "not a SIP WebSocket path")
			}
			return nil
		},
		OnHeader: func(k, v []byte) error {
			if len(s.cfg.WSOrigins) == 0 || !bytes.EqualFold(k, []byte("Origin")) {
				return nil
			}
			originSeen = true
			for _, o := range s.cfg.WSOrigins {
				if strings.EqualFold(o, string(v)) {
					return nil
				}
			}
			return wsRejected(http.StatusForbidden, "origin not allowed")
		},
		OnBeforeUpgrade: func() (ws.HandshakeHeader, error) {
			if len(s.cfg.WSOrigins) > 0 && !originSeen {
				return nil, wsRejected(http.StatusForbidden, "origin required")
			}
			if !offered {
				return nil, wsRejected(http.StatusBadRequest, "Sec-WebSocket-Protocol must offer sip")
			}
			return nil, nil
		},
	}
	rw := struct {
		io.Reader
		io.Writer
	}{bytes.NewReader(head[:end]), streamWriter{tc}}
	if _, err := u.Upgrade(rw); err != nil {
		s.metrics.WSRefused.Add(1)
		s.handshakeFailed(tc, err)
		return nil, false
	}
	tc.ready.Store(true)
	if end == len(head) {
		return nil, true
	}
	rest := head[end:]
	if len(rest) <= tcpReadSize {
		rest = append(getReadBuf(), rest...)
	}
	return rest, true
}

// readWSHead reads tc's upgrade request head up to its blank line, under
// the handshake deadline. head holds what was read (bytes past the head,
// frames sent without waiting for the answer, included; at most
// wsMaxHead in all), end the head's length; false: no head by the
// deadline, the connection ended, or no blank line within wsMaxHead bytes
// (answered 431), counted and logged as a failed handshake.
//
// Memory follows what arrived: a plain WS connection waits for bytes
// holding no buffer, reads into one from the pool and keeps only the
// bytes it read, so a connection that sent a few bytes holds a few bytes.
func (s *Server) readWSHead(tc *tcpConn) (head []byte, end int, ok bool) {
	for {
		from := max(0, len(head)-3)
		b, err := tc.readHeadBytes(wsMaxHead - len(head))
		head = append(head, b...)
		if b != nil {
			releaseReadBuf(b)
		}
		if i := bytes.Index(head[from:], crlfcrlf); i >= 0 {
			return head, from + i + 4, true
		}
		if len(head) >= wsMaxHead {
			s.handshakeFailed(tc, errors.New("request head over 4096 bytes"))
			_ = tc.sendStream([]byte("HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"))
			return nil, 0, false
		}
		if err != nil {
			s.handshakeFailed(tc, err)
			return nil, 0, false
		}
	}
}

// readHeadBytes reads the next bytes of an upgrade request head, at most
// limit (>= 1), in a buffer from the pool (nil with an error and nothing
// read): through the TLS session for WSS, else once the socket has bytes
// (readParkedUpTo).
func (c *tcpConn) readHeadBytes(limit int) ([]byte, error) {
	if c.sess == nil {
		return readParkedUpTo(c.c, limit)
	}
	b := getReadBuf()
	n, err := c.sess.Read(b[:min(limit, cap(b))])
	if n > 0 {
		return b[:n], err
	}
	releaseReadBuf(b)
	if err == nil {
		err = io.ErrNoProgress
	}
	return nil, err
}

// streamWriter writes to a connection's stream (through TLS for WSS).
type streamWriter struct{ tc *tcpConn }

func (w streamWriter) Write(p []byte) (int, error) {
	if err := w.tc.sendStream(p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// readWS reads WebSocket frames from an accepted WS or WSS connection and
// hands each complete message to handleDatagram. Its bounds are TCP's:
// the first-message deadline from accept, the idle timeout between
// messages, the message timeout from a message's first byte, and every
// buffer holding part of a message (frame bytes and the fragments
// reassembled) reserved in the partial-message budget.
//
// A connection that stays silent between messages longer than idleLinger
// is waited on by a goroutine of its own (streamWait), started for that
// wait: its stack is what waiting
// takes (2 KiB), not what the handshake and the messages grew the
// reader's to (8 KiB and more, which the runtime halves only while a
// quarter of it is unused: never below 8 KiB for a reader waiting inside
// a TLS read). The goroutine that read the message ends.
func (s *Server) readWS(tc *tcpConn) {
	firstDeadline := time.Now().Add(s.cfg.TCPFirstMessageTimeout)
	buf, ok := s.handshakeWS(tc)
	if !ok {
		s.endIdle(tc)
		return
	}
	if buf != nil {
		s.tcp.readBufs.Add(1)
	}
	s.wsFrames(tc, streamIdle{firstDeadline: firstDeadline}, buf)
}

// streamIdle is what a stream connection's reader carries across a wait
// between messages, when it holds no buffer, no fragment and no
// reservation.
type streamIdle struct {
	greeted       bool      // a message came: the first-message deadline is over
	firstDeadline time.Time // accept + TCPFirstMessageTimeout
	first         bool      // the wait's deadline is firstDeadline
}

// endIdle ends the reader of tc holding nothing (see endConn).
func (s *Server) endIdle(tc *tcpConn) {
	var reserved int64
	s.endConn(tc, &reserved, nil)
	s.wg.Done()
}

// handOver starts the goroutine that waits for the next message of tc,
// whose session (TLS) holds nothing: its read buffers go first.
func (s *Server) handOver(tc *tcpConn, st streamIdle, frames func(*Server, *tcpConn, streamIdle, []byte)) {
	if tc.sess != nil {
		releaseTLSBuffers(tc.sess)
	}
	go s.streamWait(tc, st, frames)
}

// streamWait waits for the next message of tc on a fresh goroutine (see
// readWS), then reads it with frames (wsFrames, connFrames).
func (s *Server) streamWait(tc *tcpConn, st streamIdle, frames func(*Server, *tcpConn, streamIdle, []byte)) {
	var buf []byte
	err := waitReadable(tc) // the only wait on this stack: the reads after it find bytes
	if err == nil {
		buf, err = tc.readWoken()
	}
	if buf == nil {
		s.streamReadError(tc, err, st.first, 0)
		s.endIdle(tc)
		return
	}
	s.tcp.readBufs.Add(1)
	frames(s, tc, st, buf)
}

// wsFrames is readWS from the handshake or a wait on: buf holds the bytes
// read so far (nil when none). It returns when the connection ends, or
// with a streamWait started when the connection waits for its next message.
func (s *Server) wsFrames(tc *tcpConn, st streamIdle, buf []byte) {
	var reserved int64
	var msg []byte // the fragments of a message under way, nil when none
	waits := false // a streamWait carries on: this goroutine ends holding nothing
	defer func() {
		if !waits {
			s.endConn(tc, &reserved, buf)
			s.wg.Done()
		}
	}()
	src := source{addr: tc.remote, conn: tc}
	limit := s.cfg.MaxMessage
	greeted, firstDeadline := st.greeted, st.firstDeadline
	var msgDeadline time.Time
	for {
		// Every complete frame in buf.
		need := 0 // bytes of the frame under way, once its header is in
		var ans wsAnswers
		for len(buf) > 0 {
			f, hl, err := parseWSHeader(buf)
			if err == nil && hl > 0 && !f.masked {
				err = errWSProtocol // RFC 6455 §5.1: a client masks every frame
			}
			if err == nil && hl > 0 && f.op.IsData() && (f.op == ws.OpContinuation) != (msg != nil) {
				err = errWSProtocol // a continuation with nothing to continue, or a new message inside one
			}
			if err != nil {
				s.metrics.WSProtocolErrors.Add(1)
				s.closeWS(tc, ws.StatusProtocolError)
				return
			}
			if hl == 0 {
				break
			}
			if f.op.IsData() && int64(len(msg))+f.length > int64(limit) {
				s.metrics.Oversize.Add(1)
				s.metrics.WSTooBig.Add(1)
				s.log.Debug("sip websocket message over -sip-max-message: closed 1009", "remote", tc.remote.String(), "max", limit)
				s.closeWS(tc, ws.StatusMessageTooBig)
				return
			}
			total := hl + int(f.length)
			if len(buf) < total {
				need = total
				break
			}
			p := buf[hl:total]
			ws.Cipher(p, f.mask, 0)
			switch {
			case f.op == ws.OpPing:
				ans.pongLen = copy(ans.pong[:], p)
				ans.ping = true
			case f.op == ws.OpPong:
			case f.op == ws.OpClose:
				ans.flush(s, tc)
				if len(p) == 1 {
					s.closeWS(tc, ws.StatusProtocolError)
				} else {
					s.echoClose(tc, p)
				}
				return
			case f.fin && msg == nil:
				s.wsMessage(tc, p, src, &ans)
				greeted = true
			default:
				if msg == nil {
					msg = make([]byte, 0, min(max(2*len(p), tcpReadSize), limit))
				}
				msg = append(msg, p...)
				if f.fin {
					s.wsMessage(tc, msg, src, &ans)
					greeted = true
					msg = nil
				}
			}
			buf = buf[:copy(buf, buf[total:])]
			if msg == nil {
				msgDeadline = time.Time{}
			}
		}
		if !ans.flush(s, tc) {
			return
		}
		switch {
		case buf == nil:
		case len(buf) == 0:
			releaseReadBuf(buf)
			buf = nil
			s.tcp.readBufs.Add(-1)
		case len(buf) <= tcpReadSize/2 && cap(buf) > tcpReadSize:
			buf = append(getReadBuf(), buf...)
		}
		tc.partial.Store(buf != nil || msg != nil)
		want := int64(0)
		if buf != nil || msg != nil {
			want = int64(cap(buf) + cap(msg))
		}
		if buf != nil && need > cap(buf) {
			want += int64(need - cap(buf))
		}
		if want != reserved && !s.reservePartial(tc, want, &reserved) {
			return
		}
		if buf != nil && need > cap(buf) {
			nb := append(make([]byte, 0, need), buf...)
			releaseReadBuf(buf)
			buf = nb
		}

		now := time.Now()
		dl := now.Add(s.cfg.TCPIdleTimeout)
		if buf != nil || msg != nil {
			if msgDeadline.IsZero() {
				msgDeadline = now.Add(s.cfg.TCPMessageTimeout)
			}
			dl = msgDeadline
		}
		first := !greeted && firstDeadline.Before(dl)
		if first {
			dl = firstDeadline
		}
		_ = tc.c.SetReadDeadline(dl)
		var n int
		var err error
		if buf == nil {
			switch {
			case msg != nil: // part of a message is in: wait here, its clock runs
				buf, err = tc.readIdle()
			case tc.sess != nil:
				if buf, err = tc.probeIdle(); buf == nil && err == nil { // what the session holds comes first
					dl = tc.idleDeadline(dl)
				}
			}
			if buf == nil && err == nil {
				if !tc.linger(time.Duration(s.tcp.linger.Load()), dl) {
					s.handOver(tc, streamIdle{greeted: greeted, firstDeadline: firstDeadline, first: first}, (*Server).wsFrames)
					waits = true
					return
				}
				buf, err = tc.readWoken()
			}
			n = len(buf)
			if buf != nil {
				s.tcp.readBufs.Add(1)
			}
		} else {
			n, err = tc.readMore(buf[len(buf):cap(buf)])
			buf = buf[:len(buf)+max(n, 0)]
		}
		if err != nil && n == 0 {
			s.streamReadError(tc, err, first, len(buf)+len(msg))
			return
		}
	}
}

// streamReadError counts why a stream reader ended on a read error.
func (s *Server) streamReadError(tc *tcpConn, err error, first bool, held int) {
	var ne interface{ Timeout() bool }
	switch {
	case !errors.As(err, &ne) || !ne.Timeout():
	case first:
		s.metrics.TCPFirstMessage.Add(1)
		s.log.Debug("sip connection sent no complete message in time: closed", "remote", tc.remote.String(), "transport", tc.kind.String(), "bytes", held, "timeout", s.cfg.TCPFirstMessageTimeout)
	case held > 0 || tc.waiting.Load() == idleBytes:
		s.metrics.TCPSlow.Add(1)
		s.log.Debug("sip message not complete in time: connection closed", "remote", tc.remote.String(), "transport", tc.kind.String(), "bytes", held, "timeout", s.cfg.TCPMessageTimeout)
	}
}

// wsMessage handles one complete WebSocket message: a CRLFCRLF keep-alive
// is answered with CRLF (RFC 5626 §3.5.1), anything else is a SIP message,
// after the answers owed to the frames before it.
func (s *Server) wsMessage(tc *tcpConn, p []byte, src source, ans *wsAnswers) {
	s.tcp.touch(tc)
	if string(p) == "\r\n\r\n" {
		ans.keepalives++
		return
	}
	ans.flush(s, tc)
	s.handleDatagram(p, src)
}

// wsAnswers are the answers owed to the control frames and keep-alives of
// one read, sent once: a Pong for the last Ping only (RFC 6455 §5.5.3
// allows it) and one CRLF for any number of keep-alives, so a flood of
// them costs a write per read, not per frame.
type wsAnswers struct {
	ping       bool
	pong       [125]byte
	pongLen    int
	keepalives int
}

// flush sends what is owed; false when the connection is gone.
func (a *wsAnswers) flush(s *Server, tc *tcpConn) bool {
	if a.ping {
		a.ping = false
		if tc.sendFrame(ws.OpPong, a.pong[:a.pongLen]) != nil {
			return false
		}
	}
	if a.keepalives > 0 {
		s.metrics.TCPKeepAlives.Add(uint64(a.keepalives))
		s.metrics.TCPKeepAliveWrites.Add(1)
		a.keepalives = 0
		if tc.sendFrame(ws.OpText, crlfs[:2]) != nil {
			return false
		}
	}
	return true
}

// echoClose answers a client's Close with a Close of the same status
// (RFC 6455 §5.5.1) and ends the connection.
func (s *Server) echoClose(tc *tcpConn, p []byte) {
	body := p
	if len(p) >= 2 {
		body = p[:2]
	}
	_ = tc.sendFrame(ws.OpClose, body)
	s.linger(tc)
}

// closeWS sends a Close frame with code and ends the connection.
func (s *Server) closeWS(tc *tcpConn, code ws.StatusCode) {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], uint16(code))
	_ = tc.sendFrame(ws.OpClose, b[:])
	s.linger(tc)
}

// linger half-closes tc after its last frame and reads what the peer still
// sends, for at most wsLinger and 64 KiB, so the peer reads our Close
// rather than a reset for bytes we did not read.
func (s *Server) linger(tc *tcpConn) {
	tc.mu.Lock()
	busy := tc.flushing || tc.dead
	tc.mu.Unlock()
	if busy {
		return // the flusher closes once the Close is out
	}
	_ = tc.c.CloseWrite()
	_ = tc.c.SetReadDeadline(time.Now().Add(wsLinger))
	var b [512]byte
	for n := 0; n < 64<<10; {
		k, err := tc.c.Read(b[:])
		n += k
		if err != nil {
			return
		}
	}
}
