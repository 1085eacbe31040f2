package sip

import (
	"fmt"
	"testing"

	gosip "github.com/emiago/sipgo/sip"
)

// hijackInvite sends, from c, an initial INVITE (no To-tag) that carries
// the Call-ID and From-tag of the victim's call k, as anyone who saw or
// guessed them could.
func hijackInvite(c *uac, k *call, branch string) {
	c.send(fmt.Sprintf("INVITE sip:service@%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nMax-Forwards: 70\r\nFrom: <sip:mallory@test>;tag=a%s\r\nTo: <sip:service@test>\r\nCall-ID: %s\r\nCSeq: 7 INVITE\r\nContact: <sip:mallory@%s>\r\nContent-Length: 0\r\n\r\n",
		c.lb, c.addr, branch, k.callID, k.callID, c.addr))
}

// TestDialogHijackByInitialInvite: an initial INVITE from another source
// with a victim's Call-ID and From-tag neither moves the victim's dialog
// to the backend that INVITE went to (a confirmed dialog, or one still
// ringing) nor, when that INVITE fails, removes it. The victim's
// token-less ACK and BYE still reach the backend of its own INVITE.
// Before the fix the entry was replaced (or deleted) and the BYE went to
// the attacker's backend (or the Call-ID hash's).
func TestDialogHijackByInitialInvite(t *testing.T) {
	for _, tc := range []struct {
		name      string
		attackAns int32 // how the attacker's backend answers the INVITE
		ringing   bool  // the victim's call is not yet answered
	}{
		{"confirmed-answered", modeAnswer, false},
		{"confirmed-busy", modeBusy, false},
		{"ringing-answered", modeAnswer, true},
		{"ringing-busy", modeBusy, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
			s := testServer(t, []*uas{b1, b2}, nil, func(c *Config) { c.Policy = "round-robin" })
			victim := newUAC(t, s.udpAddr())
			mallory := newUAC(t, s.udpAddr())
			k := victim.newCall()
			if tc.ringing {
				b1.mode.Store(modeRing)
				b2.mode.Store(modeRing)
			}
			k.invite("")
			victim.recvResponse(180)
			home, other := whereInvite(t, k, b1, b2)
			if !tc.ringing {
				k.learn(victim.recvResponse(200))
			}
			other.mode.Store(tc.attackAns)
			hijackInvite(mallory, k, "z9hG4bK-mallory-1")
			// Round-robin sends the attacker's INVITE to the other backend.
			eventually(t, "the attacker's INVITE at the other backend", func() bool { return other.count(gosip.INVITE, k.callID) == 1 })
			if tc.attackAns == modeBusy {
				mallory.recvResponse(486)
			} else {
				mallory.recvResponse(180)
				mallory.recvResponse(200)
			}
			id, ok := s.dialogs.peek(k.callID, "a"+k.callID, "", s.clock.Now())
			if !ok || id != home.name {
				t.Fatalf("victim's dialog entry after the attacker's INVITE: %q %v, want %q", id, ok, home.name)
			}
			if got := s.metrics.DialogReplaceRefused.Load(); got != 1 {
				t.Errorf("dialog_replace_refused %d, want 1", got)
			}
			if tc.ringing {
				return
			}
			k.tokenless(s.udpAddr().String())
			k.inDialog("ACK", 1, k.branch+"-ack")
			k.inDialog("BYE", 2, k.branch+"-bye")
			victim.recvResponseTo(gosip.BYE, 200)
			if n := home.count(gosip.BYE, k.callID); n != 1 {
				t.Errorf("victim's BYE at its INVITE's backend %d times, want 1 (at the other: %d)", n, other.count(gosip.BYE, k.callID))
			}
		})
	}
}

// TestDialogTableClaim: a new INVITE of the same source for a
// dialog not yet confirmed (a retry after a challenge, a failover) still
// moves the entry, and a confirmed one's remote insert does not replace it.
func TestDialogTableClaim(t *testing.T) {
	var dt dialogTable
	dt.init(60e9, 100)
	k := dt.key("c1", "a")
	if r := dt.claim(k, "b1", 7, 0); r != dialogInserted {
		t.Fatalf("first claim %v", r)
	}
	if r := dt.claim(k, "b2", 7, 1); r != dialogInserted {
		t.Fatalf("same source, unconfirmed: %v, want moved", r)
	}
	if r := dt.claim(k, "b1", 8, 2); r != dialogRefused {
		t.Fatalf("other source, unconfirmed: %v, want refused", r)
	}
	dt.confirm(k, "callee")
	if r := dt.claim(k, "b1", 7, 3); r != dialogRefused {
		t.Fatalf("same source, confirmed: %v, want refused", r)
	}
	if dt.insert(k, "b1", 4) {
		t.Fatal("a remote insert replaced a confirmed dialog")
	}
	if id, _ := dt.peek("c1", "a", "", 5); id != "b2" {
		t.Fatalf("entry names %q, want b2", id)
	}
	// An expired entry is replaced by anyone.
	if r := dt.claim(k, "b1", 9, 61e9); r != dialogInserted {
		t.Fatalf("expired entry: %v, want replaced", r)
	}
	if n := dt.Len(); n != 1 {
		t.Fatalf("Len %d, want 1", n)
	}
}
