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
	if !fillRouteInput(&in, parseRequest(t, head), table.HeaderNames()) {
		return "414"
	}
	if i := table.Match(&in); i >= 0 {
		return table.Spec(i).Pool
	}
	return "default"
}

// TestLongPhoneUserRoutedByNormalForm: a telephone number padded past
// lb.MaxRouteValueLen with visual separators (RFC 3966 allows them
// anywhere) or with escapes is routed by its normal form, as the backend
// reads it (unescaped, without visual separators): padding is no way out
// of the london pool (and its ARM pool=london budget). A user whose
// normal form itself is longer than lb.MaxRouteValueLen is not routed on
// a truncated form: 414.
func TestLongPhoneUserRoutedByNormalForm(t *testing.T) {
	routes := []string{"pool=london,user=+4420"}
	tail := " SIP/2.0\r\nFrom: <sip:a@a.example>;tag=1\r\nTo: <sip:b@voice.example>\r\nCSeq: 1 INVITE\r\n"
	max := lb.MaxRouteValueLen
	tests := []struct{ name, ruri, want string }{
		{"short, separators (control)", "sip:+44-20-7946-0000@voice.example;user=phone", "london"},
		{"1100 visual separators, user=phone", "sip:+4" + strings.Repeat("-", 1100) + "4207946@voice.example;user=phone", "london"},
		{"1100 visual separators, leading plus", "sip:+" + strings.Repeat(".", 1100) + "4420@voice.example", "london"},
		{"escaped plus and 400 escaped separators", "sip:%2B" + strings.Repeat("%2D", 400) + "4420@voice.example", "london"},
		{"tel: URI with 1100 separators", "tel:+44" + strings.Repeat("-", 1100) + "20", "london"},
		{"normal form of exactly the limit", "sip:+4420" + strings.Repeat("1", max-5) + "@voice.example", "london"},
		{"normal form one past the limit", "sip:+4420" + strings.Repeat("1", max-4) + "@voice.example", "414"},
		{"normal form past the limit, separators between", "sip:+4420" + strings.Repeat("1-", max) + "@voice.example", "414"},
		{"name past the limit", "sip:" + strings.Repeat("a", max+1) + "@voice.example", "414"},
		{"escaped name past the limit", "sip:" + strings.Repeat("%61", max+1) + "@voice.example", "414"},
		{"escaped name of exactly the limit", "sip:" + strings.Repeat("%61", max) + "@voice.example", "default"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := routeOf(t, routes, "INVITE "+tc.ruri+tail); got != tc.want {
				t.Errorf("pool %s, want %s", got, tc.want)
			}
		})
	}
}

// TestRouteUser: the user a route tests, golden values, and never more
// than lb.MaxRouteValueLen bytes of it held, however long the user.
func TestRouteUser(t *testing.T) {
	max := lb.MaxRouteValueLen
	tests := []struct {
		user  string
		phone bool
		want  string
		ok    bool
	}{
		{"alice.smith", false, "alice.smith", true},
		{"+44-20.(7946)", false, "+44207946", true},
		{"020-7946", true, "0207946", true},
		{"020-7946", false, "020-7946", true},
		{"%2b44%2d20", false, "+4420", true},
		{"+4420;isub=1", false, "+4420", true},
		{"a%2", false, "a%2", true},
		{"+" + strings.Repeat("-", 10*max) + "1", false, "+1", true},
		{strings.Repeat("9", max), true, strings.Repeat("9", max), true},
		{strings.Repeat("9", max+1), true, "", false},
		{strings.Repeat("9-", max+1), true, "", false},
		{strings.Repeat("%39", max+1), false, "", false},
	}
	for _, tc := range tests {
		got, ok := routeUser(tc.user, tc.phone)
		if string(got) != tc.want || ok != tc.ok {
			name := tc.user
			if len(name) > 40 {
				name = name[:40] + "..."
			}
			t.Errorf("routeUser(%q, %v) = %q, %v; want %q, %v", name, tc.phone, got, ok, tc.want, tc.ok)
		}
		if cap(got) > max {
			t.Errorf("routeUser held %d bytes, at most %d", cap(got), max)
		}
	}
}

// TestURITooLongAnswered414: new work whose Request-URI user is too long
// to route is answered 414 and forwarded nowhere.
func TestURITooLongAnswered414(t *testing.T) {
	ldn := newUAS(t, "ldn")
	dflt := newUAS(t, "dflt")
	s := poolServer(t, []string{ldn.addr.String() + ",id=ldn,pool=london", dflt.addr.String() + ",id=dflt"},
		[]string{"pool=london,user=+4420"}, nil, nil)
	c := newUAC(t, s.udpAddr())
	k := c.newCall()
	k.inviteTo("sip:+4420"+strings.Repeat("1-", lb.MaxRouteValueLen)+"@voice.example", "a.example")
	c.awaitResponse(gosip.INVITE, 414, 200)
	if n := ldn.count(gosip.INVITE, k.callID) + dflt.count(gosip.INVITE, k.callID); n != 0 {
		t.Errorf("forwarded %d times, want 0", n)
	}
	if n := s.metrics.URITooLong.Load(); n != 1 {
		t.Errorf("uri_too_long %d, want 1", n)
	}
}

// TestIPv6DomainSpellingsRouted: domain=[2001:db8::1] matches the
// address however it is written: with its zeros (RFC 4291 §2.2, equally
// valid, and the same host to the backend), in upper case, with a port.
// The host is normalised by the route table (lb), not here.
func TestIPv6DomainSpellingsRouted(t *testing.T) {
	routes := []string{"pool=v6,domain=[2001:db8::1]"}
	tail := " SIP/2.0\r\nFrom: <sip:a@a.example>;tag=1\r\nTo: <sip:b@voice.example>\r\nCSeq: 1 INVITE\r\n"
	for _, host := range []string{"[2001:db8::1]", "[2001:DB8::1]", "[2001:db8:0:0:0:0:0:1]", "[2001:0db8::0001]", "[2001:db8:0::1]:5060"} {
		if got := routeOf(t, routes, "INVITE sip:u@"+host+tail); got != "v6" {
			t.Errorf("R-URI host %s: pool %s, want v6 (the same address)", host, got)
		}
	}
}

// TestDuplicateSingleHeadersRefused: a request with two From headers
// (RFC 3261 §7.3.1 allows one) would be routed by the first
// (from-domain=) and forwarded with both, so a backend that reads the
// other one (the last, as many parsers do for single-valued headers)
// serves a caller of another domain than the one that chose the pool.
// Two Content-Lengths are refused (SLUICE-2026-002) for the same reason;
// so are two From, To, Call-ID, CSeq or Max-Forwards, in any mix of
// spellings: 400 and nothing forwarded. One of each is forwarded.
func TestDuplicateSingleHeadersRefused(t *testing.T) {
	gold := newUAS(t, "gold")
	bronze := newUAS(t, "bronze")
	s := poolServer(t, []string{gold.addr.String() + ",id=gold,pool=gold", bronze.addr.String() + ",id=bronze"},
		[]string{"pool=gold,from-domain=gold.example"}, nil, nil)
	c := newUAC(t, s.udpAddr())
	const (
		from = "From: <sip:m@gold.example>;tag=a1\r\n"
		to   = "To: <sip:bob@voice.example>\r\n"
		cseq = "CSeq: 1 MESSAGE\r\n"
		mf   = "Max-Forwards: 70\r\n"
	)
	tests := []struct {
		name, extra string
		want        int
	}{
		{"one of each", "", 200},
		{"From, From", "From: <sip:m@bronze.example>;tag=a2\r\n", 400},
		{"From, f", "f: <sip:m@bronze.example>;tag=a2\r\n", 400},
		{"From, FROM", "FROM: <sip:m@bronze.example>;tag=a2\r\n", 400},
		{"To, t", "t: <sip:eve@voice.example>\r\n", 400},
		{"Call-ID, i", "i: other-call\r\n", 400},
		{"CSeq, cseq", "cseq: 2 MESSAGE\r\n", 400},
		{"Max-Forwards twice", "Max-Forwards: 5\r\n", 400},
		{"Content-Length, l", "l: 0\r\n", 400},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k := c.newCall()
			// A User-Agent, as UAs send, leaves room for the Warning.
			c.send(fmt.Sprintf("MESSAGE sip:bob@voice.example SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\n%s%s%sCall-ID: %s\r\n%s%sUser-Agent: sluice regression test client 1.0\r\nContent-Length: 0\r\n\r\n",
				c.addr, k.branch, mf, from, to, k.callID, cseq, tc.extra))
			// A 400 may carry either Call-ID: the parser keeps the last.
			if r := c.awaitResponse(gosip.MESSAGE, tc.want, 200); tc.want == 400 {
				if w := r.GetHeader("warning"); w == nil || !strings.Contains(w.Value(), "two ") {
					t.Errorf("400 with Warning %v, want one naming the header given twice", w)
				}
			}
			n := gold.count(gosip.MESSAGE, k.callID) + bronze.count(gosip.MESSAGE, k.callID)
			if want := map[bool]int{true: 1, false: 0}[tc.want == 200]; n != want {
				t.Errorf("forwarded %d times, want %d", n, want)
			}
		})
	}
}

// TestUserPhoneParamCase: URI parameter names compare
// case-insensitively (RFC 3261 §19.1.4), and so does the value phone, so
// sip:020-7946-0000@h;USER=PHONE is the same telephone number as with
// ;user=phone for the routes (separators dropped) in any spelling.
func TestUserPhoneParamCase(t *testing.T) {
	routes := []string{"pool=london,user=0207946"}
	tail := " SIP/2.0\r\nFrom: <sip:a@a.example>;tag=1\r\nTo: <sip:b@voice.example>\r\nCSeq: 1 INVITE\r\n"
	for _, param := range []string{"user=phone", "user=Phone", "USER=PHONE", "User=phone"} {
		if got := routeOf(t, routes, "INVITE sip:020-7946-0000@voice.example;"+param+tail); got != "london" {
			t.Errorf(";%s: pool %s, want london", param, got)
		}
	}
}
