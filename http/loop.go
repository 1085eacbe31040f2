package http

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
)

// Request loops. A backend address that leads back to the same balancer
// (its own listener named as a backend, a DNS name that resolves to it,
// two balancers that name each other) would forward each request to itself
// until connections or file descriptors run out, and every client with
// them. SIP has Max-Forwards and 482/483 for this; HTTP has nothing a
// backend or balancer must honour, so sluice marks what it forwards: every
// request it sends to a backend carries one more Sluice-Via field line
// with this Server's mark, a random 16-hex-digit value made at start, and
// a request whose head already holds the mark is answered 508 Loop
// Detected (RFC 5842 §7.2) and its connection closed, before admission,
// so a loop costs one refusal and never counts against a backend.
//
// The field is a private name rather than Via, which origin servers act on
// (nginx does not compress answers to requests with Via unless told to).
// Marks from other balancers pass through: a chain of distinct sluices is
// not a loop. A client that sends a mark it could not know only refuses
// its own request.

// loopHeader is the field that carries the marks; loopHeaderLower its
// name in lower case for checkHead.
const (
	loopHeader      = "Sluice-Via"
	loopHeaderLower = "sluice-via"
)

// errLoop is the refusal of a request that carries this Server's mark.
var errLoop = &headError{status: 508, reason: "request loop: it came back to this balancer (a backend leads to sluice itself)"}

// proxyStatus is the Proxy-Status of a refused head (RFC 9209): a loop
// is proxy_loop_detected, the rest http_request_error.
func (e *headError) proxyStatus() []byte {
	if e == errLoop {
		return psLoop
	}
	return psHeadRefused
}

// newLoopMark returns a Server's mark: 16 random hex digits.
func newLoopMark() []byte {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return []byte(hex.EncodeToString(b[:]))
}

// looped reports whether head, a request head checkHead accepted, has a
// Sluice-Via field line that holds s's mark. It runs only for heads that
// have the field (headInfo.loopMarks).
func (s *Server) looped(head []byte) bool {
	for len(head) > 0 {
		eol := bytes.Index(head, []byte("\r\n"))
		if eol < 0 {
			eol = len(head)
		}
		line := head[:eol]
		head = head[min(eol+2, len(head)):]
		if len(line) > len(loopHeader) && line[len(loopHeader)] == ':' && eqFold(line[:len(loopHeader)], loopHeaderLower) &&
			bytes.Contains(line[len(loopHeader)+1:], s.loopMark) {
			return true
		}
	}
	return false
}

// checkLoop turns an accepted head that came back to this Server into
// errLoop (counted in Stats.Loops).
func (s *Server) checkLoop(hi headInfo, head []byte, err error) error {
	if err != nil || !hi.loopMarks || !s.looped(head[:hi.n]) {
		return err
	}
	s.stats.Loops.Add(1)
	return errLoop
}
