package sip

import (
	"net/netip"
	"strings"
	"testing"
)

// fastHostileResp is a 200 relayed by the Via stack: our Via, the
// client's with the received and rport we set.
const fastHostileResp = "SIP/2.0 200 OK\r\n" +
	"Via: SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bKsluXYZ\r\n" +
	"Via: SIP/2.0/UDP 10.0.0.1:5061;branch=z9hG4bKc;received=10.0.0.1;rport=5061\r\n" +
	"From: <sip:a@b>;tag=f1\r\n" +
	"To: <sip:c@d>;tag=t1\r\n" +
	"Call-ID: abc\r\n" +
	"CSeq: 1 INVITE\r\n" +
	"Content-Length: 0\r\n\r\n"

// TestFastResponseHostileSpellings: spellings of a response that a
// scanner could read otherwise than sipgo (parameter names in another
// case, a second tag, a quoted display name holding ";tag=", a tag inside
// the URI, padding, compact and duplicate headers): whether the fast path
// takes each is golden, and what it takes it reads and relays as sipgo
// does (checkFastResponse).
func TestFastResponseHostileSpellings(t *testing.T) {
	for _, v := range []struct {
		old, new string
		take     bool
	}{
		{";received=10.0.0.1", ";received=10.0.0.1;Received=6.6.6.6", true},
		{";rport=5061", ";rport=5061;RPORT=9", true},
		{"branch=z9hG4bKc", "branch=z9hG4bKc;BRANCH=zz", true},
		{"branch=z9hG4bKsluXYZ", "branch=z9hG4bKsluXYZ;Branch=evil", true},
		{";received=10.0.0.1", ";received=10.0.0.1;received=6.6.6.6", false},
		{";tag=t1", ";tag=t1;TAG=t2", true},
		{";tag=t1", ";tag=t1;tag=t2", false},
		{"From: <sip:a@b>;tag=f1", "From: <sip:a@b>;tag=f1;TAG=zz", true},
		{"From: <sip:a@b>;tag=f1", "From: <sip:a@b;tag=zz>;tag=f1", true},
		{"From: <sip:a@b>;tag=f1", `From: "x;tag=zz" <sip:a@b>;tag=f1`, true},
		{"From: <sip:a@b>;tag=f1", "From: <sip:a@b>;tag=f1\r\nf: <sip:x@y>;tag=zz", false},
		{"To: <sip:c@d>", "To: Bob <sip:c@d>", true},
		{"To: <sip:c@d>", "To: Bob  <sip:c@d>", true},
		{"To: <sip:c@d>", "To: <sip:c@d;a=b;A=c>", true},
		{"To: <sip:c@d>;tag=t1", "t: <sip:c@d>;tag=t1", false},
		{"Content-Length: 0\r\n\r\n", "Content-Length:  0\r\n\r\n", true},
		{"Content-Length: 0\r\n\r\n", "Content-Length: 0\r\nl: 0\r\n\r\n", false},
		{"Content-Length: 0\r\n\r\n", "Content-Length: 00\r\n\r\n", false},
		{"Content-Length: 0\r\n\r\n", "Content-Length: 0\r\n\r\nX", false},
		{"Call-ID: abc", "Call-ID: abc\r\nX: a, b", true},
		{"Call-ID: abc", "Call-ID: abc\r\ni: abd", false},
		{"Call-ID: abc", "Call-ID: a\x00bc", false},
		{"Call-ID: abc\r\n", "Call-ID: abc\n", false},
		{"Call-ID: abc\r\n", "Call-ID: abc\r\r\n", false},
		{"CSeq: 1 INVITE", "CSeq: 1 INVITEx", false},
		{"Via: SIP/2.0/UDP 10.0.0.1", "v: SIP/2.0/UDP 10.0.0.1", false},
		{"Via: SIP/2.0/UDP 10.0.0.1", "Via : SIP/2.0/UDP 10.0.0.1", false},
		{"rport=5061\r\n", "rport=5061, SIP/2.0/UDP 6.6.6.6:5060;branch=z9hG4bKx\r\n", true},
		{"rport=5061\r\n", "rport=5061,SIP/2.0/UDP 6.6.6.6:5060;branch=z9hG4bKx\r\n", false},
	} {
		msg := []byte(strings.Replace(fastHostileResp, v.old, v.new, 1))
		var sc respScan
		if got := scanResponse(msg, &sc); got != v.take {
			t.Errorf("scanResponse = %v, want %v for\n%q", got, v.take, msg)
		}
		checkFastResponse(t, msg)
	}
}

// TestFastInDialogHostileSpellings: as TestFastResponseHostileSpellings
// for the in-dialog fast path: a second token in another case, a
// transport or maddr parameter in our Route, an alias in a compact
// Contact, a second From in its compact form, the client's own received
// and rport in another case.
func TestFastInDialogHostileSpellings(t *testing.T) {
	s, fill := inDialogServer(t)
	src := source{addr: netip.MustParseAddrPort("127.0.0.1:5061")}
	for _, v := range []struct {
		old, new  string
		take      bool
		aliasSeen bool
	}{
		{"2BYE\r\n", "2BYE;Received=1.1.1.1;RPORT=3\r\n", true, false},
		{"2BYE\r\n", "2BYE;rport;Rport=1\r\n", true, false},
		{"Route: <sip:$LB;lr;sl=$TOKEN>", "Route: <sip:$LB;lr;sl=$TOKEN;SL=bad>", true, false},
		{"Route: <sip:$LB;lr;sl=$TOKEN>", "Route: <sip:$LB;lr;SL=bad;sl=$TOKEN>", true, false},
		{"Route: <sip:$LB;lr;sl=$TOKEN>", "Route: <sip:$LB;lr;sl=bad;sl=$TOKEN>", false, false},
		{"Route: <sip:$LB;lr;sl=$TOKEN>", "Route: <sip:$LB;lr;sl=$TOKEN;Transport=tcp>", true, false},
		{"Route: <sip:$LB;lr;sl=$TOKEN>", "Route: <sip:$LB;lr;sl=$TOKEN;maddr=10.9.9.9>", true, false},
		{";tag=4243SIPpTag011", ";tag=4243SIPpTag011;TAG=x", true, false},
		{"Contact: sip:sipp@127.0.0.1", "m: <sip:sipp@127.0.0.1;SLA=x>", true, true},
		{"Contact: sip:sipp@127.0.0.1", "Contact: <sip:sipp@127.0.0.1;sla=x>", true, true},
		{"From: sipp <sip:sipp@127.0.0.1>;tag=4242SIPpTag001", "f: sipp <sip:sipp@127.0.0.1>;tag=4242SIPpTag001", true, false},
		{"Subject: Performance Test", "Subject: Performance Test\r\nf: <sip:x@y>;tag=zz", false, false},
		{"BYE sip:127.0.0.1:5071;transport=UDP", "BYE sip:127.0.0.1:5071;transport=UDP;maddr=1.2.3.4", true, false},
		{"BYE sip:127.0.0.1:5071;transport=UDP", "BYE sip:u@127.0.0.1:5071;Transport=UDP", true, false},
		{"Max-Forwards: 70", "Max-Forwards: 2147483647", true, false},
		{"Max-Forwards: 70", "Max-Forwards: 2147483648", false, false},
		{"Max-Forwards: 70", "Max-Forwards: -1", false, false},
	} {
		msg := []byte(fill(strings.Replace(fastReq, v.old, v.new, 1)))
		var rq reqScan
		if got := scanInDialog(msg, &rq); got != v.take || got && rq.alias != v.aliasSeen {
			t.Errorf("scanInDialog = %v (alias %v), want %v (alias %v) for\n%q", got, rq.alias, v.take, v.aliasSeen, msg)
		}
		checkFastInDialog(t, s, msg, src)
	}
}
