package sip

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"
	"github.com/sluicelb/sluice/lb"
)

// TestRouteTokenHostile: a Route token that is tampered with, replayed
// after its expiry, signed with another key or made for another call is
// never admitted as affinity (403, counted, nothing reaches a backend),
// while a token made the same way with the right key, Call-ID and a live
// expiry passes, so each refusal is down to the one thing wrong with it.
func TestRouteTokenHostile(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, nil)
	c := newUAC(t, s.udpAddr())
	k := c.newCall()
	k.invite("")
	c.recvResponse(180)
	k.learn(c.recvResponse(200))
	k.inDialog("ACK", 1, k.branch+"-ack")
	if len(k.route) != 1 {
		t.Fatalf("route set %v, want one Record-Route", k.route)
	}
	tokRe := regexp.MustCompile(`sl=([^;>]+)`)
	m := tokRe.FindStringSubmatch(k.route[0])
	if m == nil {
		t.Fatalf("no token in %q", k.route[0])
	}
	good := m[1]
	orig := k.route[0]
	withTok := func(tok string) string { return strings.Replace(orig, good, tok, 1) }
	signer, _ := lb.NewSigner(testKey)
	other, _ := lb.NewSigner([]byte("another key of thirty-two bytes!"))
	subject := tokenSubject("b1", k.callID)
	// Another character of the token's own alphabet: a flipped bit could
	// make one a URI may not hold ('{', ','), and the request would be
	// refused as malformed (400) before its token is looked at.
	tampered := []byte(good)
	if i := len(tampered) / 2; tampered[i] == 'A' {
		tampered[i] = 'B'
	} else {
		tampered[i] = 'A'
	}
	cases := []struct {
		name, route string
	}{
		{"tampered", withTok(string(tampered))},
		{"truncated", withTok(good[:len(good)-3])},
		{"replayed after expiry", withTok(signer.Token(subject, time.Now().Add(-time.Second)))},
		{"other key", withTok(other.Token(subject, time.Now().Add(time.Hour)))},
		{"other call", withTok(signer.Token(tokenSubject("b1", "another-call@test"), time.Now().Add(time.Hour)))},
		{"backend id only", withTok(signer.Token("b1", time.Now().Add(time.Hour)))},
		{"empty", withTok("")},
	}
	for i, tc := range cases {
		k.route = []string{tc.route}
		k.inDialog("INFO", 10+i, fmt.Sprintf("%s-bad-%d", k.branch, i))
		if res := c.recvResponseTo(gosip.INFO, 403); res == nil {
			t.Fatalf("%s: no 403", tc.name)
		}
	}
	if got := b1.count(gosip.INFO, k.callID); got != 0 {
		t.Errorf("%d hostile in-dialog requests reached the backend, want 0", got)
	}
	if got := s.metrics.ForgedTokens.Load(); got != uint64(len(cases)) {
		t.Errorf("forged tokens counted %d, want %d", got, len(cases))
	}
	// The control: the same construction with everything right passes.
	k.route = []string{withTok(signer.Token(subject, time.Now().Add(time.Hour)))}
	k.inDialog("BYE", 50, k.branch+"-bye")
	c.recvResponseTo(gosip.BYE, 200)
	if got := b1.count(gosip.BYE, k.callID); got != 1 {
		t.Errorf("BYE with a genuine rebuilt token reached the backend %d times, want 1", got)
	}
}
