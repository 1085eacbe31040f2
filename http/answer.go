//go:build linux

package http

import (
	"bytes"
	"errors"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/lb"
)

// Body framings of a response.
const (
	frameNone = iota
	frameLength
	frameChunked
	frameClose
)

var crlf2 = []byte("\r\n\r\n")

var errBadAnswer = errors.New("malformed answer from backend")

// consume handles the bytes in bc.in[r:w]: the answer's head, then body
// bytes. It returns true when the exchange ended (complete or failed).
func (l *evloop) consume(bc *bconn) bool {
	c := bc.c
	x := &c.x
	if !x.gotHead {
		buf := bc.in[bc.r:bc.w]
		end := bytes.Index(buf, crlf2)
		if end < 0 {
			return false
		}
		hlen := end + 4
		if x.log.first == 0 {
			x.log.first = l.now
		}
		h := &l.respH
		l.rd.Reset(buf[:hlen])
		l.br.Reset(&l.rd)
		if err := h.Read(l.br); err != nil {
			l.failed(c, errBadAnswer, lb.ServerError)
			return true
		}
		st := h.StatusCode()
		if !statusLineOK(buf) || st < 100 || st > 599 {
			// RFC 9110 §15: three digits, the first 1 to 5. fasthttp
			// reads "001" as 1, which was relayed as an interim answer
			// "HTTP/1.1 1", and "000" as 200.
			l.failed(c, errBadAnswer, lb.ServerError)
			return true
		}
		if st < 200 {
			if st == fasthttp.StatusSwitchingProtocols {
				// A tunnel only for the upgrade the request asked for;
				// any other 101 leaves a connection that is no longer
				// HTTP: failed closes it.
				if x.upgrade != nil && switchOK(h, x.upgrade) {
					l.switchTunnel(c, bc, hlen)
					return true
				}
				l.failed(c, errBadAnswer, lb.ServerError)
				return true
			}
			// 1xx informational: relayed without hop-by-hop headers, at
			// most maxInformational of them, all within the backend
			// timeout of the final answer (relay does not extend it
			// before the final head).
			if x.informational++; x.informational > maxInformational {
				l.failed(c, errInformational, lb.ServerError)
				return true
			}
			ih := l.informational(h)
			x.log.headOut += int64(len(ih))
			l.writeClient(c, ih)
			bc.r += hlen
			return false
		}
		x.gotHead, x.status = true, st
		x.log.status = st
		bc.deadline = l.now + int64(l.s.cfg.BackendTimeout) // from here, between bytes of the body
		cl := h.ContentLength()
		switch {
		case x.head || st == fasthttp.StatusNoContent || st == fasthttp.StatusNotModified:
			x.framing = frameNone
		case cl >= 0:
			x.framing, x.remain = frameLength, int64(cl)
		case cl == -1:
			x.framing, x.chunk = frameChunked, chunkScan{}
		default:
			x.framing = frameClose
		}
		// An answer with both Transfer-Encoding and Content-Length is
		// relayed chunked (RFC 9112 §6.3), but the connection it came on
		// is not trusted with another request.
		// After an upgrade request the backend connection is not reused
		// whatever the answer: it leaves the pool for good.
		x.bclose = x.upgrade != nil || h.ConnectionClose() || x.framing == frameClose ||
			(x.framing == frameChunked && hasField(buf[:hlen], "content-length"))
		if l.s.endedByCritical(&x.plan) {
			l.abort(c)
			return true
		}
		l.s.prepareResponse(h, &x.plan, c.ip)
		switch x.framing {
		case frameNone:
			if cl >= 0 {
				h.SetContentLength(cl) // a HEAD answer keeps its length
			}
		case frameLength:
			h.SetContentLength(cl)
		case frameChunked:
			h.SetContentLength(-1)
		case frameClose:
			h.SetContentLength(-2)
			x.closeAfter = true
		}
		h.ResetConnectionClose()
		if x.closeAfter || l.e.stopping.Load() {
			h.SetConnectionClose()
		}
		h.SetNoDefaultContentType(true)
		bc.r += hlen
		out := h.AppendBytes(l.out[:0])
		x.log.headOut += int64(len(out))
		k, done, err := x.bodyBytes(bc.in[bc.r:bc.w])
		if err != nil {
			l.failed(c, errBadAnswer, lb.ServerError)
			return true
		}
		out = append(out, bc.in[bc.r:bc.r+k]...)
		l.out = out[:0]
		bc.r += k
		if done {
			l.settle(c)
		}
		l.writeClient(c, out)
		if done {
			l.complete(c)
		}
		return done || c.fd < 0
	}
	k, done, err := x.bodyBytes(bc.in[bc.r:bc.w])
	if err != nil {
		l.failed(c, errBadAnswer, lb.ServerError)
		return true
	}
	if done {
		l.settle(c)
	}
	l.writeClient(c, bc.in[bc.r:bc.r+k])
	bc.r += k
	if done {
		l.complete(c)
	}
	return done || c.fd < 0
}

// informational returns the 1xx head h as relayed to the client: without
// hop-by-hop headers (those Connection names too), as a final answer's.
func (l *evloop) informational(h *fasthttp.ResponseHeader) []byte {
	var seen uint16
	for k := range h.All() {
		seen |= headerBit(k)
	}
	if seen&hHopByHop != 0 {
		stripHopByHop(seen, h.Peek("Connection"), h.DelBytes, h.Del)
	}
	h.ResetConnectionClose()
	h.SetNoDefaultContentType(true)
	out := h.AppendBytes(l.out[:0])
	l.out = out[:0]
	return out
}

// bodyBytes returns how many bytes of p belong to the answer's body and
// whether the body ends within them.
func (x *exchange) bodyBytes(p []byte) (int, bool, error) {
	switch x.framing {
	case frameNone:
		return 0, true, nil
	case frameLength:
		k := int64(len(p))
		if k >= x.remain {
			k = x.remain
		}
		x.remain -= k
		return int(k), x.remain == 0, nil
	case frameChunked:
		return x.chunk.feed(p)
	}
	return len(p), false, nil // frameClose: until the backend closes
}

// statusLineOK reports whether head starts with "HTTP/1.x " and a status
// code of three digits whose first is 1 to 5, followed by a space or the
// end of the line.
func statusLineOK(head []byte) bool {
	const v = len("HTTP/1.x ")
	if len(head) < v+4 || !bytes.HasPrefix(head, []byte("HTTP/1.")) || head[v-1] != ' ' {
		return false
	}
	c := head[v : v+3]
	if c[0] < '1' || c[0] > '5' || c[1] < '0' || c[1] > '9' || c[2] < '0' || c[2] > '9' {
		return false
	}
	return head[v+3] == ' ' || head[v+3] == '\r' || head[v+3] == '\n'
}
