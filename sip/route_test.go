package sip

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"
)

func TestFrame(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		size int
		ok   bool
		err  bool
	}{
		{"complete", "OPTIONS x SIP/2.0\r\nContent-Length: 2\r\n\r\nhi", 42, true, false},
		{"compact l", "OPTIONS x SIP/2.0\r\nl: 0\r\n\r\nNEXT", 27, true, false},
		{"partial body", "OPTIONS x SIP/2.0\r\nContent-Length: 5\r\n\r\nhi", 0, false, false},
		{"partial headers", "OPTIONS x SIP/2.0\r\nContent-Len", 0, false, false},
		{"no content-length", "OPTIONS x SIP/2.0\r\nVia: x\r\n\r\n", 0, false, true},
		{"garbage content-length", "OPTIONS x SIP/2.0\r\nContent-Length: 1a\r\n\r\n", 0, false, true},
		{"over max", "OPTIONS x SIP/2.0\r\nContent-Length: 99999\r\n\r\n", 0, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			size, ok, err := frame([]byte(tc.in), 65535)
			if size != tc.size || ok != tc.ok || (err != nil) != tc.err {
				t.Errorf("frame = %d, %v, %v; want %d, %v, err %v", size, ok, err, tc.size, tc.ok, tc.err)
			}
		})
	}
}

func TestTokenSubject(t *testing.T) {
	subj := tokenSubject("b|1", "call@x")
	if id, ok := splitSubject(subj, "call@x"); !ok || id != "b|1" {
		t.Errorf("round trip: %q %v", id, ok)
	}
	if _, ok := splitSubject(subj, "other@x"); ok {
		t.Error("subject accepted for another Call-ID")
	}
	if _, ok := splitSubject("no-separator", "call@x"); ok {
		t.Error("malformed subject accepted")
	}
}

func TestBranches(t *testing.T) {
	br := newBrancher(nil)
	inv, _ := gosip.ParseMessage([]byte("INVITE sip:a@b SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bKabc\r\nCall-ID: c\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n"))
	cancel, _ := gosip.ParseMessage([]byte("CANCEL sip:a@b SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bKabc\r\nCall-ID: c\r\nCSeq: 1 CANCEL\r\nContent-Length: 0\r\n\r\n"))
	src := source{addr: netip.MustParseAddrPort("10.0.0.1:5060")}
	other := source{addr: netip.MustParseAddrPort("10.0.0.66:5060")}
	ki, kc := clientTxnOf(inv.(*gosip.Request), src), clientTxnOf(cancel.(*gosip.Request), src)
	if ki.key() != kc.key() {
		t.Errorf("INVITE and its CANCEL have client keys %q and %q", ki.key(), kc.key())
	}
	if ko := clientTxnOf(cancel.(*gosip.Request), other); ko.key() == ki.key() {
		t.Errorf("a CANCEL from another address has the INVITE's client key %q", ko.key())
	}
	d1, d2 := target{addr: netip.MustParseAddrPort("10.0.1.1:5060")}, target{addr: netip.MustParseAddrPort("10.0.1.2:5060")}
	lh := loopHash(inv.(*gosip.Request))
	if lh != loopHash(cancel.(*gosip.Request)) {
		t.Error("a CANCEL's loop hash differs from its INVITE's")
	}
	b1, b2 := br.branch(&ki, lh, d1), br.branch(&ki, lh, d2)
	if b1 != br.branch(&kc, lh, d1) || b1 == b2 || !strings.HasPrefix(b1, "z9hG4bK") {
		t.Errorf("branches %q %q: want deterministic per backend, RFC 3261 cookie", b1, b2)
	}
	if !br.verify(b1, &ki, d1) || br.verify(b1, &ki, d2) {
		t.Errorf("branch %q: want it verified for the address it went to only", b1)
	}
	if newBrancher(nil).branch(&ki, lh, d1) == b1 {
		t.Error("two keys gave the same branch")
	}
	old, _ := gosip.ParseMessage([]byte("INVITE sip:a@b SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.1:5060\r\nCall-ID: c\r\nCSeq: 7 INVITE\r\nContent-Length: 0\r\n\r\n"))
	if k := clientTxnOf(old.(*gosip.Request), src).key(); !strings.Contains(k, "|c|7|") {
		t.Errorf("RFC 2543 client key %q: want Call-ID and CSeq in it", k)
	}
}

func TestDialogCreating(t *testing.T) {
	for m, want := range map[gosip.RequestMethod]bool{
		gosip.INVITE: true, gosip.SUBSCRIBE: true, gosip.REFER: true, gosip.NOTIFY: true, gosip.MESSAGE: true, "FOO": true,
		gosip.BYE: false, gosip.ACK: false, gosip.CANCEL: false, gosip.PRACK: false, gosip.UPDATE: false, gosip.INFO: false,
	} {
		if got := dialogCreating(m); got != want {
			t.Errorf("dialogCreating(%s) = %v", m, got)
		}
	}
}

func TestJitter(t *testing.T) {
	s := &Server{}
	for i := 0; i < 200; i++ {
		if v := s.jitter(4 * time.Second); v < 4 || v > 6 {
			t.Fatalf("jitter(4s) = %d, want 4..6", v)
		}
		if v := s.jitter(0); v != 1 {
			t.Fatalf("jitter(0) = %d, want 1", v)
		}
	}
}
