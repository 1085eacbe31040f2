package sip

import (
	"time"
)

// maxTokenDraws bounds how often routeToken draws a token again. One draw
// in about 200,000 needs a second; sixteen in a row is a broken signer.
const maxTokenDraws = 16

// routeToken returns the affinity token for our Record-Route, naming the
// dialog's pool and subject (tokenSubject), one that never contains the
// text "CSeq" in any mix of case.
//
// A token is base64url text, so now and then it spells "CSeq" (about one
// in 200,000 for the usual 90 characters). SIPp, and any parser that finds
// the CSeq header with an unanchored search for that text, then reads the
// method from inside our Record-Route instead of the CSeq line: the
// relayed 180 and 200 match no request the client sent, and the client
// aborts the call ("unexpected message ... while expecting '100' (index
// 1), received 'SIP/2.0 180 Ringing'"). The token's nonce differs on every
// draw, so a token that contains the text is drawn again; nothing is lost
// but a few microseconds.
func (s *Server) routeToken(pool, subject string, expires time.Time) string {
	tok := s.signer.PoolToken(pool, subject, expires)
	for i := 1; i < maxTokenDraws && containsCSeq(tok); i++ {
		s.metrics.TokenRedraws.Add(1)
		tok = s.signer.PoolToken(pool, subject, expires)
	}
	return tok
}

// containsCSeq reports whether s contains "cseq" in any mix of case.
func containsCSeq(s string) bool {
	for i := 0; i+4 <= len(s); i++ {
		if s[i]|0x20 == 'c' && s[i+1]|0x20 == 's' && s[i+2]|0x20 == 'e' && s[i+3]|0x20 == 'q' {
			return true
		}
	}
	return false
}
