package sip

import (
	"bytes"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/sluicelb/sluice/lb"
)

// TestVerifyTokenBinding: a Record-Route token opens only for the Call-ID
// it was issued for, only while its key is in the ring and only before it
// expires.
func TestVerifyTokenBinding(t *testing.T) {
	oldKey := lb.Key{ID: 1, Secret: []byte("old sip key, 16+ bytes long.....")}
	newKey := lb.Key{ID: 2, Secret: []byte("new sip key, 16+ bytes long.....")}
	ring := func(keys ...lb.Key) *lb.Signer {
		s, err := lb.NewRingSigner(keys)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	before, during, after := ring(oldKey), ring(oldKey, newKey), ring(newKey)
	later := time.Now().Add(time.Hour)
	const call = "a84b4c76e66710@pc33.example.com"
	oldTok := before.Token(tokenSubject("10.0.0.7:5060", call), later)
	newTok := during.Token(tokenSubject("10.0.0.7:5060", call), later)
	tests := []struct {
		name   string
		s      *lb.Signer
		token  string
		callID string
		want   bool
	}{
		{"same call", during, newTok, call, true},
		{"token copied to another call", during, newTok, "other@pc33.example.com", false},
		{"old key still listed", during, oldTok, call, true},
		{"old key, another call", during, oldTok, "other@pc33.example.com", false},
		{"old key removed", after, oldTok, call, false},
		{"expired", during, during.Token(tokenSubject("10.0.0.7:5060", call), time.Now().Add(-time.Second)), call, false},
		{"tampered", during, newTok[:20] + string('A'+(newTok[20]-'A'+1)%26) + newTok[21:], call, false},
		{"truncated", during, newTok[:len(newTok)-4], call, false},
		{"empty", during, "", call, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := &Server{signer: tc.s}
			id, ok := s.verifyToken(tc.token, tc.callID)
			if ok != tc.want || ok && id != "10.0.0.7:5060" {
				t.Errorf("verifyToken = %q, %v; want %v", id, ok, tc.want)
			}
		})
	}
}

// TestRecordRouteHidesBackend: the token a client sees in our
// Record-Route names the backend, whose id is its address, to the
// balancer only; the dialog still completes through it.
func TestRecordRouteHidesBackend(t *testing.T) {
	b1 := newUAS(t, "b1")
	addr := b1.addr.String()
	s := testServer(t, []*uas{b1}, nil, func(c *Config) { c.Backends[0].ID = addr })
	c := newUAC(t, s.udpAddr())
	k := c.newCall()
	k.complete() // INVITE, ACK and BYE: the BYE found b1 through the token
	if len(k.route) != 1 {
		t.Fatalf("route set %q, want one entry", k.route)
	}
	i := strings.Index(k.route[0], tokenParam+"=")
	if i < 0 {
		t.Fatalf("no %s= in %q", tokenParam, k.route[0])
	}
	tok := k.route[0][i+len(tokenParam)+1:]
	if j := strings.IndexAny(tok, ";>"); j >= 0 {
		tok = tok[:j]
	}
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		t.Fatalf("token %q: %v", tok, err)
	}
	ip := b1.addr.Addr()
	for _, leak := range [][]byte{[]byte(addr), []byte(ip.String()), ip.AsSlice(), []byte(k.callID)} {
		if bytes.Contains(raw, leak) {
			t.Errorf("token %q contains %q", tok, leak)
		}
	}
	if b1.count("BYE", k.callID) != 1 {
		t.Errorf("BYE reached b1 %d times, want 1", b1.count("BYE", k.callID))
	}
}
