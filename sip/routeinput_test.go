package sip

import (
	"fmt"
	"strings"
	"testing"

	gosip "github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/lb"
)

// parseRequest parses a request the way the server does.
func parseRequest(t testing.TB, head string) *gosip.Request {
	t.Helper()
	msg := head + "Via: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bK-ri\r\nMax-Forwards: 70\r\nCall-ID: ri@test\r\nContent-Length: 0\r\n\r\n"
	m, err := newParser().ParseSIP([]byte(msg))
	if err != nil {
		t.Fatalf("parse %q: %v", head, err)
	}
	req, ok := m.(*gosip.Request)
	if !ok {
		t.Fatalf("%q is not a request", head)
	}
	return req
}

// str shows a RouteInput field, "<nil>" for an absent one.
func str(b []byte) string {
	if b == nil {
		return "<nil>"
	}
	return string(b)
}

// TestFillRouteInput: what the routes see of a request, field by field
// (golden values).
func TestFillRouteInput(t *testing.T) {
	names := []string{"x-region", "subject", "priority"}
	tests := []struct {
		name                     string
		head                     string
		host, user, method, from string
		headers                  [3]string
	}{
		{
			name: "domain as written, case kept for the table",
			head: "INVITE sip:+442079460000@Voice.Example SIP/2.0\r\nFrom: <sip:alice@atlanta.example>;tag=1\r\nTo: <sip:+442079460000@voice.example>\r\nCSeq: 1 INVITE\r\n",
			host: "Voice.Example", user: "+442079460000", method: "INVITE", from: "atlanta.example",
			headers: [3]string{"<nil>", "<nil>", "<nil>"},
		},
		{
			name: "escaped plus",
			head: "INVITE sip:%2B4420794@voice.example:5070;transport=udp SIP/2.0\r\nFrom: sip:bob@Biloxi.Example;tag=2\r\nTo: <sip:x@voice.example>\r\nCSeq: 1 INVITE\r\n",
			host: "voice.example", user: "+4420794", method: "INVITE", from: "Biloxi.Example",
			headers: [3]string{"<nil>", "<nil>", "<nil>"},
		},
		{
			name: "telephone number with visual separators and isub",
			head: "INVITE sip:+44-20-(7946).0000;isub=12@voice.example;user=phone SIP/2.0\r\nFrom: \"A <b>\" <sip:[2001:DB8::1]:5060>;tag=3\r\nTo: <sip:x@voice.example>\r\nCSeq: 1 INVITE\r\n",
			host: "voice.example", user: "+442079460000", method: "INVITE", from: "[2001:DB8::1]",
			headers: [3]string{"<nil>", "<nil>", "<nil>"},
		},
		{
			name: "user=phone without plus",
			head: "INVITE sip:020-7946-0000@voice.example;user=phone SIP/2.0\r\nFrom: <sip:a@h.example>;tag=1\r\nTo: <sip:x@voice.example>\r\nCSeq: 1 INVITE\r\n",
			host: "voice.example", user: "02079460000", method: "INVITE", from: "h.example",
			headers: [3]string{"<nil>", "<nil>", "<nil>"},
		},
		{
			name: "a name keeps its dots",
			head: "MESSAGE sip:alice.smith@Example.COM SIP/2.0\r\nFrom: <sips:bob@b.example>;tag=1\r\nTo: <sip:alice.smith@example.com>\r\nCSeq: 1 MESSAGE\r\n",
			host: "Example.COM", user: "alice.smith", method: "MESSAGE", from: "b.example",
			headers: [3]string{"<nil>", "<nil>", "<nil>"},
		},
		{
			name: "tel URI: no host",
			head: "INVITE tel:+44-20-7946-0000;phone-context=example.com SIP/2.0\r\nFrom: <tel:+331234>;tag=1\r\nTo: <tel:+44-20-7946-0000>\r\nCSeq: 1 INVITE\r\n",
			host: "<nil>", user: "+442079460000", method: "INVITE", from: "<nil>",
			headers: [3]string{"<nil>", "<nil>", "<nil>"},
		},
		{
			name: "REGISTER: a R-URI without user",
			head: "REGISTER sip:registrar.example SIP/2.0\r\nFrom: <sip:alice@registrar.example>;tag=1\r\nTo: <sip:alice@registrar.example>\r\nCSeq: 1 REGISTER\r\n",
			host: "registrar.example", user: "<nil>", method: "REGISTER", from: "registrar.example",
			headers: [3]string{"<nil>", "<nil>", "<nil>"},
		},
		{
			name: "headers: any case, compact form, first value, empty present",
			head: "SUBSCRIBE sip:presence@p.example SIP/2.0\r\nf: <sip:carol@Chicago.example>;tag=1\r\nTo: <sip:presence@p.example>\r\nCSeq: 1 SUBSCRIBE\r\nX-REGION: eu-west\r\nx-region: us\r\ns: hello world\r\nPriority:\r\n",
			host: "p.example", user: "presence", method: "SUBSCRIBE", from: "Chicago.example",
			headers: [3]string{"eu-west", "hello world", ""},
		},
		{
			name: "a From host with a port and parameters, no user",
			head: "OPTIONS sip:q@o.example SIP/2.0\r\nFrom: <sip:gw.example:5080;transport=tcp>;tag=1\r\nTo: <sip:q@o.example>\r\nCSeq: 1 OPTIONS\r\n",
			host: "o.example", user: "q", method: "OPTIONS", from: "gw.example",
			headers: [3]string{"<nil>", "<nil>", "<nil>"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := parseRequest(t, tc.head)
			var in lb.RouteInput
			in.Headers[5] = []byte("stale") // every field is overwritten
			fillRouteInput(&in, req, names)
			got := []string{str(in.Host), str(in.Path), str(in.Method), str(in.FromHost), str(in.Headers[0]), str(in.Headers[1]), str(in.Headers[2]), str(in.Headers[5])}
			want := []string{tc.host, tc.user, tc.method, tc.from, tc.headers[0], tc.headers[1], tc.headers[2], "<nil>"}
			if strings.Join(got, "|") != strings.Join(want, "|") {
				t.Errorf("host|user|method|from|h0|h1|h2|h5\n got %s\nwant %s", strings.Join(got, "|"), strings.Join(want, "|"))
			}
		})
	}
}

// TestRouteInputPicksPool: the first route that matches what
// fillRouteInput saw wins, else the pool default.
func TestRouteInputPicksPool(t *testing.T) {
	var specs []lb.RouteSpec
	for _, s := range []string{
		"pool=london,domain=voice.example,user=+4420",
		"pool=paris,domain=*.voice.example,user=+33",
		"pool=registrar,method=REGISTER",
		"pool=eu,header=X-Region:eu-west",
		"pool=partners,from-domain=*.partner.example",
	} {
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
	names := table.HeaderNames()
	tests := []struct{ head, want string }{
		{"INVITE sip:+442079460000@VOICE.example. SIP/2.0\r\nFrom: <sip:a@a.example>;tag=1\r\nTo: <sip:b@voice.example>\r\nCSeq: 1 INVITE\r\n", "london"},
		{"INVITE sip:%2b44-20-7946@voice.example SIP/2.0\r\nFrom: <sip:a@a.example>;tag=1\r\nTo: <sip:b@voice.example>\r\nCSeq: 1 INVITE\r\n", "london"},
		{"INVITE sip:+4420@other.example SIP/2.0\r\nFrom: <sip:a@a.example>;tag=1\r\nTo: <sip:b@voice.example>\r\nCSeq: 1 INVITE\r\n", "default"},
		{"INVITE sip:+331234@fr.voice.example SIP/2.0\r\nFrom: <sip:a@a.example>;tag=1\r\nTo: <sip:b@voice.example>\r\nCSeq: 1 INVITE\r\n", "paris"},
		{"INVITE sip:+331234@voice.example SIP/2.0\r\nFrom: <sip:a@a.example>;tag=1\r\nTo: <sip:b@voice.example>\r\nCSeq: 1 INVITE\r\n", "default"},
		{"REGISTER sip:voice.example SIP/2.0\r\nFrom: <sip:a@a.example>;tag=1\r\nTo: <sip:a@a.example>\r\nCSeq: 1 REGISTER\r\n", "registrar"},
		{"register sip:voice.example SIP/2.0\r\nFrom: <sip:a@a.example>;tag=1\r\nTo: <sip:a@a.example>\r\nCSeq: 1 register\r\n", "registrar"}, // the parser reads (and the proxy forwards) REGISTER
		{"MESSAGE sip:x@y.example SIP/2.0\r\nFrom: <sip:a@a.example>;tag=1\r\nTo: <sip:x@y.example>\r\nCSeq: 1 MESSAGE\r\nx-region: eu-west\r\n", "eu"},
		{"MESSAGE sip:x@y.example SIP/2.0\r\nFrom: <sip:a@a.example>;tag=1\r\nTo: <sip:x@y.example>\r\nCSeq: 1 MESSAGE\r\nX-Region: EU-WEST\r\n", "default"},
		{"MESSAGE sip:x@y.example SIP/2.0\r\nFrom: \"P\" <sip:a@gw.Partner.example>;tag=1\r\nTo: <sip:x@y.example>\r\nCSeq: 1 MESSAGE\r\n", "partners"},
		{"MESSAGE sip:x@y.example SIP/2.0\r\nFrom: <sip:a@partner.example>;tag=1\r\nTo: <sip:x@y.example>\r\nCSeq: 1 MESSAGE\r\n", "default"},
	}
	for _, tc := range tests {
		var in lb.RouteInput
		fillRouteInput(&in, parseRequest(t, tc.head), names)
		got := "default"
		if i := table.Match(&in); i >= 0 {
			got = table.Spec(i).Pool
		}
		if got != tc.want {
			t.Errorf("%s: pool %s, want %s", strings.SplitN(tc.head, "\r\n", 2)[0], got, tc.want)
		}
	}
}

// TestFillRouteInputAllocs: filling the input of an ordinary request
// copies nothing.
func TestFillRouteInputAllocs(t *testing.T) {
	req := parseRequest(t, "INVITE sip:+442079460000@voice.example SIP/2.0\r\nUser-Agent: x\r\nAllow: INVITE\r\nFrom: \"Alice\" <sip:alice@atlanta.example>;tag=1\r\nTo: <sip:+442079460000@voice.example>\r\nCSeq: 1 INVITE\r\nX-Region: eu\r\n")
	names := []string{"x-region", "subject"}
	var in lb.RouteInput
	if n := testing.AllocsPerRun(100, func() { fillRouteInput(&in, req, names) }); n != 0 {
		t.Errorf("%v allocations per fill, want 0", n)
	}
}

func BenchmarkFillRouteInput(b *testing.B) {
	req := parseRequest(b, "INVITE sip:+442079460000@voice.example SIP/2.0\r\nUser-Agent: x\r\nAllow: INVITE\r\nFrom: \"Alice\" <sip:alice@atlanta.example>;tag=1\r\nTo: <sip:+442079460000@voice.example>\r\nCSeq: 1 INVITE\r\nX-Region: eu\r\n")
	names := []string{"x-region", "subject"}
	var in lb.RouteInput
	b.ReportAllocs()
	for b.Loop() {
		fillRouteInput(&in, req, names)
	}
}

// BenchmarkRouteNewWork is what routing adds to a new-work request: the
// input filled from the parsed request and the first matching route, at
// 1 to 1,000 routes (domain and user routes; the request matches the
// last one).
func BenchmarkRouteNewWork(b *testing.B) {
	req := parseRequest(b, "INVITE sip:+442079460000@voice.example SIP/2.0\r\nUser-Agent: x\r\nFrom: \"Alice\" <sip:alice@atlanta.example>;tag=1\r\nTo: <sip:+442079460000@voice.example>\r\nCSeq: 1 INVITE\r\n")
	for _, n := range []int{1, 10, 100, 1000} {
		var specs []lb.RouteSpec
		for i := range n - 1 {
			r, err := lb.ParseRouteSpec("sip", fmt.Sprintf("pool=p%d,domain=d%d.example,user=+%d", i%50, i, 1000+i))
			if err != nil {
				b.Fatal(err)
			}
			specs = append(specs, r)
		}
		last, _ := lb.ParseRouteSpec("sip", "pool=london,domain=voice.example,user=+4420")
		table, err := lb.NewRouteTable("sip", append(specs, last))
		if err != nil {
			b.Fatal(err)
		}
		names := table.HeaderNames()
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var in lb.RouteInput
				fillRouteInput(&in, req, names)
				if table.Match(&in) != n-1 {
					b.Fatal("no match")
				}
			}
		})
	}
}

// FuzzRouteInput: whatever a client writes in the Request-URI, the From
// and the headers, filling the route input neither panics nor makes up
// bytes: the host, method and From host are slices of what was parsed,
// and the user is at most as long as the one written.
func FuzzRouteInput(f *testing.F) {
	f.Add("sip:+44-20%2d7946@Voice.Example;user=phone", `"A" <sip:a@[::1]:5060>;tag=1`, "eu")
	f.Add("tel:+4420;phone-context=x", "<tel:+1>;tag=2", "")
	f.Add("sip:%zz%2@h", "sip:x@y;tag=3", "%")
	f.Add("sips:@", `"<" <sip:@>`, "a, b")
	table, err := lb.NewRouteTable("sip", []lb.RouteSpec{
		{Proto: "sip", Pool: "a", Prefix: "+4420"},
		{Proto: "sip", Pool: "b", Header: "x-region", HeaderValue: "eu"},
		{Proto: "sip", Pool: "c", FromDomain: "*.example"},
	})
	if err != nil {
		f.Fatal(err)
	}
	p := newParser()
	f.Fuzz(func(t *testing.T, ruri, from, region string) {
		msg := "INVITE " + ruri + " SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bK-f\r\nFrom: " + from +
			"\r\nTo: <sip:x@y>\r\nCall-ID: f@t\r\nCSeq: 1 INVITE\r\nX-Region: " + region + "\r\nContent-Length: 0\r\n\r\n"
		m, err := p.ParseSIP([]byte(msg))
		if err != nil {
			return
		}
		req, ok := m.(*gosip.Request)
		if !ok {
			return
		}
		var in lb.RouteInput
		fillRouteInput(&in, req, table.HeaderNames())
		if len(in.Path) > len(req.Recipient.User)+len(req.Recipient.Raw()) {
			t.Fatalf("user %q from %q: longer than written", in.Path, ruri)
		}
		if len(in.FromHost) > len(from) || len(in.Host) > len(ruri) {
			t.Fatalf("host %q / From host %q longer than written", in.Host, in.FromHost)
		}
		table.Match(&in)
	})
}

// BenchmarkRouteUserPadded is the cost of a telephone user padded with
// 1,100 visual separators: one pass, one copy of at most
// lb.MaxRouteValueLen bytes.
func BenchmarkRouteUserPadded(b *testing.B) {
	user := "+4" + strings.Repeat("-", 1100) + "4207946"
	b.ReportAllocs()
	for b.Loop() {
		if out, ok := routeUser(user, true); !ok || len(out) != 9 {
			b.Fatal(string(out), ok)
		}
	}
}
