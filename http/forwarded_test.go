package http

import (
	"bufio"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// TestForwardedClient: the client a trusted proxy names is the rightmost
// forwarding address that is not itself a trusted proxy (nginx's
// real_ip_recursive), never an address the client wrote ahead of the
// proxy's; the leftmost when all are trusted; an entry that is no address
// ends the walk.
func TestForwardedClient(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ff::/48")}
	s := &Server{trusted: trusted}
	for _, tc := range []struct {
		name, headers, want string
	}{
		{"attacker ahead of the proxy's entry", "X-Forwarded-For: 6.6.6.6, 192.0.2.10\r\n", "192.0.2.10"},
		{"trusted hop right of the client", "X-Forwarded-For: 192.0.2.10, 127.0.0.3\r\n", "192.0.2.10"},
		{"two trusted hops", "X-Forwarded-For: 6.6.6.6, 192.0.2.10, 10.1.2.3, 127.0.0.3\r\n", "192.0.2.10"},
		{"one address", "X-Forwarded-For: 192.0.2.10\r\n", "192.0.2.10"},
		{"all trusted: the leftmost", "X-Forwarded-For: 10.0.0.7, 127.0.0.3\r\n", "10.0.0.7"},
		{"lines joined in order", "X-Forwarded-For: 6.6.6.6\r\nX-Forwarded-For: 192.0.2.10, 127.0.0.9\r\n", "192.0.2.10"},
		{"second line appended by the proxy", "X-Forwarded-For: 192.0.2.99, 6.6.6.6\r\nX-Forwarded-For: 192.0.2.10\r\n", "192.0.2.10"},
		{"garbage on the left is ignored", "X-Forwarded-For: <script>, 192.0.2.10\r\n", "192.0.2.10"},
		{"garbage between: the trusted address right of it", "X-Forwarded-For: 192.0.2.10, garbage, 127.0.0.3\r\n", "127.0.0.3"},
		{"garbage rightmost: none", "X-Forwarded-For: 192.0.2.10, unknown\r\n", ""},
		{"empty entries skipped", "X-Forwarded-For: , 192.0.2.10,, 127.0.0.3 ,\r\n", "192.0.2.10"},
		{"ports", "X-Forwarded-For: 6.6.6.6, 192.0.2.10:5555, [2001:db8:ff::1]:443\r\n", "192.0.2.10"},
		{"IPv6 client", "X-Forwarded-For: 2001:db8::7, 127.0.0.1\r\n", "2001:db8::7"},
		{"v4-mapped unmapped", "X-Forwarded-For: ::ffff:192.0.2.10\r\n", "192.0.2.10"},
		{"v4-mapped trusted hop", "X-Forwarded-For: 192.0.2.10, ::ffff:127.0.0.1\r\n", "192.0.2.10"},
		{"zone rejected", "X-Forwarded-For: fe80::1%eth0\r\n", ""},
		{"bad port", "X-Forwarded-For: 192.0.2.10:http\r\n", ""},
		{"empty value", "X-Forwarded-For: \r\n", ""},
		{"Forwarded for=", "Forwarded: for=6.6.6.6, for=192.0.2.10;proto=https\r\n", "192.0.2.10"},
		{"Forwarded quoted IPv6 and trusted hop", "Forwarded: for=\"[2001:db8::7]:4711\", for=127.0.0.2;by=x\r\n", "2001:db8::7"},
		{"Forwarded comma inside quotes is no element", "Forwarded: for=192.0.2.10;host=\"a,for=6.6.6.6\"\r\n", "192.0.2.10"},
		{"Forwarded element without for= is no address", "Forwarded: for=192.0.2.10, proto=https\r\n", ""},
		{"Forwarded unknown", "Forwarded: for=unknown, for=_hidden\r\n", ""},
		{"Forwarded case", "FORWARDED: For=192.0.2.10\r\n", "192.0.2.10"},
		{"X-Forwarded-For wins over Forwarded", "Forwarded: for=6.6.6.6\r\nX-Forwarded-For: 192.0.2.10\r\n", "192.0.2.10"},
		{"none", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h fasthttp.RequestHeader
			if err := h.Read(bufio.NewReader(strings.NewReader("GET / HTTP/1.1\r\nHost: x\r\n" + tc.headers + "\r\n"))); err != nil {
				t.Fatal(err)
			}
			got := s.forwardedClient(&h)
			if (tc.want == "" && got.IsValid()) || (tc.want != "" && got != netip.MustParseAddr(tc.want)) {
				t.Errorf("%q: got %v, want %q", tc.headers, got, tc.want)
			}
		})
	}
	var h fasthttp.RequestHeader
	h.Read(bufio.NewReader(strings.NewReader("GET / HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 6.6.6.6, 192.0.2.10:80, 127.0.0.3\r\nForwarded: for=1.2.3.4\r\n\r\n")))
	if n := testing.AllocsPerRun(100, func() { s.forwardedClient(&h) }); n != 0 {
		t.Errorf("forwardedClient allocates %v times, want 0", n)
	}
}

// TestAccessLogForwardedFor: behind a trusted proxy the logged client is
// the address the proxy appended, not the one the client put first.
func TestAccessLogForwardedFor(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r, sink := logRig(t, rigOpts{backends: 1, cfg: Config{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}})
		c, err := net.Dial("tcp", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte("GET /xff HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 6.6.6.6, 192.0.2.10\r\n\r\n"))
		var resp fasthttp.Response
		if err := resp.Read(bufio.NewReader(c)); err != nil {
			t.Fatal(err)
		}
		l := sink.next(t)
		if l.Forwarded != netip.MustParseAddr("192.0.2.10") || !strings.Contains(l.line, `"forwarded_for":"192.0.2.10"`) {
			t.Errorf("forwarded_for %v, line %s: want 192.0.2.10", l.Forwarded, l.line)
		}
	})
}
