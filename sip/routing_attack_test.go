package sip

import (
	"fmt"
	"strings"
	"testing"

	gosip "github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/lb"
)

// routeOf returns the pool the routes give the request head (parsed as
// the server parses it), "default" when none matches.
func routeOf(t *testing.T, routes []string, head string) string {
	t.Helper()
	var specs []lb.RouteSpec
	for _, s := range routes {
		r, err := lb.ParseRouteSpec("sip", s)
		if err != nil {
			t.Fatal(err)
		}
		specs = append(specs, r)
	}
	table, err := lb.NewRouteTable("sip", specs)
	if err != nil {
		t.Fatal(err)
	}
	var in lb.RouteInput
	fillRouteInput(&in, parseRequest(t, head), table.HeaderNames())
	if i := table.Match(&in); i >= 0 {
		return table.Spec(i).Pool
	}
	return "default"
}

// TestAttackLongPhoneUserDodgesUserRoute: a telephone number padded past
// lb.MaxRouteValueLen with visual separators (RFC 3966 allows them
// anywhere) or with escapes is passed to the routes as written, so
// user=+4420 does not match it, while the backend, which unescapes the
// user and drops the separators, reads a London number: the request
// leaves the london pool (and its ARM pool=london budget) for the pool
// default. A short number spelled the same way is routed to london.
func TestAttackLongPhoneUserDodgesUserRoute(t *testing.T) {
	routes := []string{"pool=london,user=+4420"}
	tail := " SIP/2.0\r\nFrom: <sip:a@a.example>;tag=1\r\nTo: <sip:b@voice.example>\r\nCSeq: 1 INVITE\r\n"
	tests := []struct{ name, ruri string }{
		{"short, separators (control)", "sip:+44-20-7946-0000@voice.example;user=phone"},
		{"1100 visual separators, user=phone", "sip:+4" + strings.Repeat("-", 1100) + "4207946@voice.example;user=phone"},
		{"1100 visual separators, leading plus", "sip:+" + strings.Repeat(".", 1100) + "4420@voice.example"},
		{"escaped plus and 400 escaped separators", "sip:%2B" + strings.Repeat("%2D", 400) + "4420@voice.example"},
		{"tel: URI with 1100 separators", "tel:+44" + strings.Repeat("-", 1100) + "20"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := routeOf(t, routes, "INVITE "+tc.ruri+tail); got != "london" {
				t.Errorf("pool %s, want london: the number is +4420... once unescaped and without visual separators, as the backend reads it", got)
			}
		})
	}
}

// TestAttackIPv6DomainSpellingDodgesRoute: domain=[2001:db8::1] matches
// only that spelling; the same address written with its zeros
// (RFC 4291 §2.2, equally valid, and the same host to the backend)
// dodges the route. (RouteSpec's comment says an IPv6 host must arrive in
// its RFC 5952 form to match: a limit a client chooses to step around.)
func TestAttackIPv6DomainSpellingDodgesRoute(t *testing.T) {
	routes := []string{"pool=v6,domain=[2001:db8::1]"}
	tail := " SIP/2.0\r\nFrom: <sip:a@a.example>;tag=1\r\nTo: <sip:b@voice.example>\r\nCSeq: 1 INVITE\r\n"
	for _, host := range []string{"[2001:db8::1]", "[2001:DB8::1]", "[2001:db8:0:0:0:0:0:1]", "[2001:0db8::0001]", "[2001:db8:0::1]:5060"} {
		if got := routeOf(t, routes, "INVITE sip:u@"+host+tail); got != "v6" {
			t.Errorf("R-URI host %s: pool %s, want v6 (the same address)", host, got)
		}
	}
}

// TestAttackDuplicateFromRefused: a request with two From headers
// (RFC 3261 §7.3.1 allows one) is routed by the first (from-domain=) and
// forwarded with both, so a backend that reads the other one (the last,
// as many parsers do for single-valued headers) serves a caller of
// another domain than the one that chose the pool. Two Content-Lengths
// are already refused (SLUICE-2026-002) for the same reason; two Froms
// should be too: 400 and nothing forwarded.
func TestAttackDuplicateFromRefused(t *testing.T) {
	gold := newUAS(t, "gold")
	bronze := newUAS(t, "bronze")
	s := poolServer(t, []string{gold.addr.String() + ",id=gold,pool=gold", bronze.addr.String() + ",id=bronze"},
		[]string{"pool=gold,from-domain=gold.example"}, nil, nil)
	c := newUAC(t, s.udpAddr())
	for _, froms := range []string{
		"From: <sip:m@gold.example>;tag=a1\r\nFrom: <sip:m@bronze.example>;tag=a2\r\n",
		"f: <sip:m@gold.example>;tag=a1\r\nFrom: <sip:m@bronze.example>;tag=a2\r\n",
	} {
		k := c.newCall()
		c.send(fmt.Sprintf("MESSAGE sip:bob@voice.example SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nMax-Forwards: 70\r\n%sTo: <sip:bob@voice.example>\r\nCall-ID: %s\r\nCSeq: 1 MESSAGE\r\nContent-Length: 0\r\n\r\n",
			c.addr, k.branch, froms, k.callID))
		if code := finalAnswerTo(t, c, k.callID); code != 400 {
			t.Errorf("%q: answered %d, want 400", froms, code)
		}
		if n := gold.count(gosip.MESSAGE, k.callID) + bronze.count(gosip.MESSAGE, k.callID); n != 0 {
			t.Errorf("%q: forwarded %d times (gold %d), want refused", froms, n, gold.count(gosip.MESSAGE, k.callID))
		}
	}
}

// TestAttackUserPhoneParamCase: URI parameter names compare
// case-insensitively (RFC 3261 §19.1.4), so sip:020-7946-0000@h;USER=PHONE
// is the same telephone number as with ;user=phone, but only the lower-case
// spelling makes the user a telephone number for the routes (separators
// dropped): the upper-case one keeps its separators and dodges
// user=0207946.
func TestAttackUserPhoneParamCase(t *testing.T) {
	routes := []string{"pool=london,user=0207946"}
	tail := " SIP/2.0\r\nFrom: <sip:a@a.example>;tag=1\r\nTo: <sip:b@voice.example>\r\nCSeq: 1 INVITE\r\n"
	for _, param := range []string{"user=phone", "user=Phone", "USER=PHONE", "User=phone"} {
		if got := routeOf(t, routes, "INVITE sip:020-7946-0000@voice.example;"+param+tail); got != "london" {
			t.Errorf(";%s: pool %s, want london", param, got)
		}
	}
}
