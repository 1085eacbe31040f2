package sip

import (
	"fmt"
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
		_, valid := s.verifyToken(token, strings.TrimSpace(callID))
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
