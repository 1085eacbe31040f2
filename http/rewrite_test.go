package http

import (
	"bufio"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// TestForwardingHeadersOwned: a client outside -http-trusted-proxy cannot
// make the backend see an address, scheme or host of its choosing: every
// line of the forwarding headers sluice owns, in any case and in the
// underscore spelling CGI servers read alike, is removed before sluice
// writes its own, on both engines. From a trusted proxy the lists are
// joined and appended to, and a single line of the others is kept.
func TestForwardingHeadersOwned(t *testing.T) {
	const attack = "GET /p HTTP/1.1\r\nHost: shop.example\r\n" +
		"X-Forwarded-For: 203.0.113.9\r\nx-forwarded-for: 6.6.6.6\r\nX-FORWARDED-FOR: 6.6.6.7\r\n" +
		"Forwarded: for=203.0.113.9\r\nforwarded: for=6.6.6.6\r\n" +
		"X-Forwarded-Proto: http\r\nx-forwarded-proto: https\r\n" +
		"X-Forwarded-Host: evil.example\r\n" +
		"X-Real-IP: 6.6.6.6\r\n" +
		"X_Forwarded_For: 6.6.6.8\r\nX-Forwarded_For: 6.6.6.9\r\nx_real_ip: 6.6.6.10\r\nX_Forwarded_Proto: https\r\nX_FORWARDED_HOST: evil.example\r\n" +
		"X-Forwarded-Port: 8443\r\nX-Forwarded-Prefix: /evil\r\nx-forwarded-ssl: on\r\nX-Forwarded-Scheme: https\r\nX_Forwarded_Prefix: /evil\r\n" +
		"X-Kept: 1\r\n\r\n"
	const single = "GET /p HTTP/1.1\r\nHost: shop.example\r\nX-Forwarded-For: 203.0.113.9\r\n" +
		"X-Forwarded-Proto: https\r\nX-Forwarded-Host: www.example\r\nX-Real-IP: 203.0.113.9\r\n\r\n"
	for _, tc := range []struct {
		name    string
		trusted bool
		raw     string
		want    map[string]string // header -> all its lines joined by "|"; "" = absent
	}{
		{"untrusted", false, attack, map[string]string{
			"X-Forwarded-For":    "127.0.0.1",
			"Forwarded":          `for=127.0.0.1;proto=http;host="shop.example"`,
			"X-Forwarded-Proto":  "http",
			"X-Forwarded-Host":   "",
			"X-Real-Ip":          "",
			"X-Forwarded-Port":   "",
			"X-Forwarded-Prefix": "",
			"X-Forwarded-Ssl":    "",
			"X-Forwarded-Scheme": "",
		}},
		{"untrusted single lines", false, single, map[string]string{
			"X-Forwarded-For":   "127.0.0.1",
			"X-Forwarded-Proto": "http",
			"X-Forwarded-Host":  "",
			"X-Real-Ip":         "",
		}},
		{"trusted", true, attack, map[string]string{
			"X-Forwarded-For":    "203.0.113.9, 6.6.6.6, 6.6.6.7, 127.0.0.1",
			"Forwarded":          `for=203.0.113.9, for=6.6.6.6, for=127.0.0.1;proto=http;host="shop.example"`,
			"X-Forwarded-Proto":  "http", // two lines: which is meant is unknown
			"X-Forwarded-Host":   "evil.example",
			"X-Real-Ip":          "6.6.6.6",
			"X-Forwarded-Port":   "8443",
			"X-Forwarded-Prefix": "/evil",
			"X-Forwarded-Ssl":    "on",
		}},
		{"trusted single lines", true, single, map[string]string{
			"X-Forwarded-For":   "203.0.113.9, 127.0.0.1",
			"X-Forwarded-Proto": "https",
			"X-Forwarded-Host":  "www.example",
			"X-Real-Ip":         "203.0.113.9",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			onEngines(t, func(t *testing.T) {
				var cfg Config
				if tc.trusted {
					cfg.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
				}
				r := newRig(t, rigOpts{backends: 1, cfg: cfg})
				if got := rawRoundTrip(t, r.addr, tc.raw); !strings.HasPrefix(got, "200\n") {
					t.Fatalf("answer %q", got)
				}
				hs := r.backends[0].lastHeaders()
				for name, want := range tc.want {
					if got := strings.Join(hs[name], "|"); got != want {
						t.Errorf("backend got %s %q, want %q", name, got, want)
					}
				}
				var aliases []string
				for name := range hs {
					if strings.Contains(name, "_") {
						aliases = append(aliases, name)
					}
				}
				sort.Strings(aliases)
				if len(aliases) > 0 {
					t.Errorf("backend got underscore spellings %v", aliases)
				}
				if tc.raw == attack && hs["X-Kept"] == nil {
					t.Error("an end-to-end header was lost")
				}
			})
		})
	}
}

func TestHeaderBitsForwarding(t *testing.T) {
	for name, want := range map[string]uint16{
		"X-Forwarded-For": hXForwardedFor, "x-forwarded-for": hXForwardedFor, "X-FORWARDED-FOR": hXForwardedFor,
		"Forwarded": hForwarded, "X-Forwarded-Proto": hXForwardedProto, "X-Forwarded-Host": hXForwardedHost,
		"X-Real-IP": hXRealIP, "x-real-ip": hXRealIP,
		"X_Forwarded_For": hForwardingAlias, "X-Forwarded_For": hForwardingAlias, "x_real_ip": hForwardingAlias,
		"X_Forwarded_Proto": hForwardingAlias, "X_Forwarded-Host": hForwardingAlias,
		"X-Forwarded-Port": hXForwardedOther, "x-forwarded-prefix": hXForwardedOther, "X-Forwarded-Ssl": hXForwardedOther,
		"X-Forwarded-Scheme": hXForwardedOther, "X_Forwarded_Scheme": hForwardingAlias, "X-Forwarded_Port": hForwardingAlias,
		"X-Forwarded-Fo_": 0, "X_Real_IQ": 0, "Forwarded_": 0,
	} {
		if got := headerBit([]byte(name)); got != want {
			t.Errorf("headerBit(%q) = %s, want %s", name, fmt.Sprintf("%b", got), fmt.Sprintf("%b", want))
		}
	}
}

// TestDelNamesEverySpelling: every underscore spelling of every forwarding
// name, each sent twice, and the X-Forwarded-Port family are all removed
// from an untrusted client's request, and nothing else.
func TestDelNamesEverySpelling(t *testing.T) {
	var raw strings.Builder
	raw.WriteString("GET / HTTP/1.1\r\nHost: a\r\n")
	var sent int
	for _, name := range []string{"X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "X-Real-IP",
		"X-Forwarded-Port", "X-Forwarded-Prefix", "X-Forwarded-Ssl", "X-Forwarded-Scheme"} {
		i := strings.IndexByte(name, '-')
		j := strings.LastIndexByte(name, '-')
		for _, sp := range []string{
			name[:i] + "_" + name[i+1:],
			name[:j] + "_" + name[j+1:],
			strings.ReplaceAll(name, "-", "_"),
		} {
			fmt.Fprintf(&raw, "%s: 1\r\n%s: 2\r\n", sp, strings.ToLower(sp))
			sent++
		}
		fmt.Fprintf(&raw, "%s: 3\r\n", name)
	}
	raw.WriteString("X-Kept: 1\r\nX_Kept: 2\r\n\r\n")
	if sent != 24 {
		t.Fatalf("%d spellings", sent)
	}
	var req fasthttp.Request
	if err := req.Read(bufio.NewReader(strings.NewReader(raw.String()))); err != nil {
		t.Fatal(err)
	}
	s := &Server{loopMark: []byte("m")}
	s.prepareRequest(&req.Header, netip.MustParseAddr("192.0.2.1"), false)
	var got []string
	for k, v := range req.Header.All() {
		got = append(got, string(k)+"="+string(v))
	}
	sort.Strings(got)
	want := []string{"Forwarded=for=192.0.2.1;proto=http;host=\"a\"", "Host=a", "Sluice-Via=m", "X-Forwarded-For=192.0.2.1", "X-Forwarded-Proto=http", "X-Kept=1", "X_kept=2"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("headers after the rewrite:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestForwardedHostNotInjected: a Host whose reg-name holds ',', ';' or
// '=' (RFC 3986 sub-delimiters, which the head check accepts) is left out
// of the Forwarded header sluice writes: quoted, it was still read by
// parsers that split Forwarded on ',' and ';' (Rack's) as elements of its
// own, for=6.6.6.6 and proto=https, a client address and scheme of the
// client's choosing. A plain host, with a port or an IPv6 literal, stays.
func TestForwardedHostNotInjected(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1})
		for _, tc := range []struct{ host, want string }{
			{"a,for=6.6.6.6;proto=https", "for=127.0.0.1;proto=http"},
			{"a;for=6.6.6.6", "for=127.0.0.1;proto=http"},
			{"x,host=evil.example", "for=127.0.0.1;proto=http"},
			{"a!$&'()*+=b", "for=127.0.0.1;proto=http"},
			{"Shop.example:8080", `for=127.0.0.1;proto=http;host="Shop.example:8080"`},
			{"[::1]:80", `for=127.0.0.1;proto=http;host="[::1]:80"`},
		} {
			raw := "GET /p HTTP/1.1\r\nHost: " + tc.host + "\r\n\r\n"
			if got := rawRoundTrip(t, r.addr, raw); !strings.HasPrefix(got, "200\n") {
				t.Fatalf("Host %q: answer %q", tc.host, got)
			}
			if got := strings.Join(r.backends[0].lastHeaders()["Forwarded"], "|"); got != tc.want {
				t.Errorf("Host %q: backend got Forwarded %q, want %q", tc.host, got, tc.want)
			}
		}
	})
}
