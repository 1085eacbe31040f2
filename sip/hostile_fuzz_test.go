package sip

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sluicelb/sluice/lb"
)

// FuzzAffinityToken: an in-dialog request carrying our Route with any
// Call-ID and any token is admitted as affinity only when the token is one
// the balancer signed for that Call-ID and it has not expired; and a
// genuine one that parses always is.
func FuzzAffinityToken(f *testing.F) {
	b1 := newUAS(f, "b1")
	b1.drop.Store(true)
	s := testServer(f, []*uas{b1}, nil, nil)
	signer, _ := lb.NewSigner(testKey)
	other, _ := lb.NewSigner([]byte("another key of thirty-two bytes!"))
	cid := "fuzz-1@test"
	good := signer.Token(tokenSubject("b1", cid), time.Now().Add(time.Hour))
	f.Add(cid, good)
	f.Add(cid, signer.Token(tokenSubject("b1", cid), time.Now().Add(-time.Second)))
	f.Add(cid, other.Token(tokenSubject("b1", cid), time.Now().Add(time.Hour)))
	f.Add("other@test", good)
	f.Add(cid, signer.Token("b1", time.Now().Add(time.Hour)))
	f.Add(cid, good[:len(good)-2])
	f.Add(cid, "")
	f.Add("", good)
	src := source{addr: netip.MustParseAddrPort("127.0.0.1:9")}
	n := 0
	f.Fuzz(func(t *testing.T, callID, token string) {
		if strings.ContainsAny(callID, "\r\n") || strings.ContainsAny(token, "\r\n;>,\" \t") {
			return // would change the message's structure, not the token
		}
		n++
		msg := fmt.Sprintf("BYE sip:b@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bK-fz%d\r\nMax-Forwards: 70\r\nRoute: <sip:%s;lr;sl=%s>\r\nFrom: <sip:a@test>;tag=fa\r\nTo: <sip:b@test>;tag=fb\r\nCall-ID: %s\r\nCSeq: 2 BYE\r\nContent-Length: 0\r\n\r\n",
			n, s.udpAddr(), token, callID)
		reqs, aff := s.metrics.Requests.Load(), s.metrics.Affinity.Load()
		s.handleDatagram([]byte(msg), src)
		parsed := s.metrics.Requests.Load() > reqs
		admitted := s.metrics.Affinity.Load() > aff
		_, _, valid := s.verifyToken(token, strings.TrimSpace(callID))
		if admitted && !valid {
			t.Fatalf("Call-ID %q token %q admitted as affinity", callID, token)
		}
		if parsed && valid && !admitted && s.metrics.Panics.Load() == 0 {
			t.Fatalf("Call-ID %q genuine token %q not admitted", callID, token)
		}
		if p := s.metrics.Panics.Load(); p != 0 {
			t.Fatalf("%d handler panics", p)
		}
	})
}

// FuzzTCPStream sends any bytes, split at any point, over a real TCP
// connection: the reader frames, answers or closes without a panic, the
// connection ends once the peer has closed (nothing is held for it), and the
// server still answers the next connection.
func FuzzTCPStream(f *testing.F) {
	b1 := newUAS(f, "b1")
	b1.drop.Store(true)
	s := testServer(f, []*uas{b1}, nil, func(c *Config) { c.TCPMessageTimeout = 200 * time.Millisecond })
	opt := "OPTIONS sip:x@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/TCP 127.0.0.1:9;branch=z9hG4bK-s\r\nMax-Forwards: 0\r\nFrom: <sip:a@t>;tag=1\r\nTo: <sip:x@t>\r\nCall-ID: s@t\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n"
	for _, seed := range []string{opt, "\r\n\r\n" + opt + opt, "\r\n", strings.Replace(opt, "Content-Length: 0", "Content-Length: 99999", 1),
		strings.Replace(opt, "Content-Length: 0", "Content-Length: 10", 1) + "short", "garbage\r\n\r\n"} {
		f.Add([]byte(seed), uint16(len(seed)/2))
	}
	f.Fuzz(func(t *testing.T, b []byte, cut uint16) {
		c, err := net.Dial("tcp", s.udpAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		k := min(int(cut), len(b))
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(b[:k]); err == nil {
			_, _ = c.Write(b[k:])
		}
		_ = c.(*net.TCPConn).CloseWrite()
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Fatalf("connection not ended by the server: %v", err)
		}
		if p := s.metrics.Panics.Load(); p != 0 {
			t.Fatalf("%d handler panics", p)
		}
		// The next connection is served: a well-formed OPTIONS is answered.
		next, err := net.Dial("tcp", s.udpAddr().String())
		if err != nil {
			t.Fatalf("next connection: %v", err)
		}
		defer next.Close()
		_ = next.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(next, opt); err != nil {
			t.Fatalf("next connection: write: %v", err)
		}
		res, err := bufio.NewReader(next).ReadString('\n')
		if err != nil || !strings.HasPrefix(res, "SIP/2.0 ") {
			t.Fatalf("next connection: no SIP answer to an OPTIONS after %q: %q %v", b, res, err)
		}
	})
}
