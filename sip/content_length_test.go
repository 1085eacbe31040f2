package sip

import (
	"fmt"
	"testing"

	gosip "github.com/emiago/sipgo/sip"
)

// TestDuplicateContentLengthRefused: a request with two Content-Length
// headers (also spelt "l") is answered 400 and never forwarded. Before the
// fix both headers went to the backend with the body, so a backend that
// frames its TCP stream by the first (0) read the body as another request,
// an INVITE here, that no admission decision saw.
func TestDuplicateContentLengthRefused(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, func(c *Config) { c.UnknownDialog = "hash" })
	c := newUAC(t, s.udpAddr())
	inner := "INVITE sip:x@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/TCP 192.0.2.1;branch=z9hG4bKsmuggled\r\nFrom: <sip:m@x>;tag=9\r\nTo: <sip:x@x>\r\nCall-ID: smuggled\r\nCSeq: 1 INVITE\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
	for i, cls := range [][2]string{
		{"Content-Length: 0", fmt.Sprintf("l: %d", len(inner))},
		{fmt.Sprintf("Content-Length: %d", len(inner)), "Content-Length: 0"},
		{fmt.Sprintf("Content-Length: %d", len(inner)), fmt.Sprintf("l: %d", len(inner))},
	} {
		id := fmt.Sprintf("dup-cl-%d", i)
		c.send(fmt.Sprintf("BYE sip:a@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-dupcl-%d;rport\r\nFrom: <sip:a@x>;tag=1\r\nTo: <sip:b@x>;tag=2\r\nCall-ID: %s\r\nCSeq: 1 BYE\r\nMax-Forwards: 70\r\n%s\r\n%s\r\n\r\n%s",
			c.addr, i, id, cls[0], cls[1], inner))
		c.recvResponse(400)
		if n := b1.count(gosip.BYE, id); n != 0 {
			t.Errorf("%v: %d BYEs with two Content-Lengths at the backend, want 0", cls, n)
		}
	}
	// One Content-Length is fine.
	c.send(fmt.Sprintf("BYE sip:a@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-onecl;rport\r\nFrom: <sip:a@x>;tag=1\r\nTo: <sip:b@x>;tag=2\r\nCall-ID: one-cl\r\nCSeq: 1 BYE\r\nMax-Forwards: 70\r\nl: 0\r\n\r\n", c.addr))
	c.recvResponse(200)
}
