package http

import (
	"bufio"
	"bytes"

	"github.com/valyala/fasthttp"

	"strings"
	"testing"
)

// TestCheckHeadVectors: golden vectors of the request-head check. Each
// head is either accepted with the framing shown or refused with the
// status and reason shown; RFC 9112 section numbers say why.
func TestCheckHeadVectors(t *testing.T) {
	const h = "Host: x\r\n"
	for _, tc := range []struct {
		name    string
		head    string
		status  int   // 0: accepted
		bodyLen int64 // when accepted
		chunked bool
		reason  string // substring of the refusal
	}{
		{"plain GET", "GET / HTTP/1.1\r\n" + h + "\r\n", 0, -1, false, ""},
		{"content-length", "POST / HTTP/1.1\r\n" + h + "Content-Length: 5\r\n\r\n", 0, 5, false, ""},
		{"content-length OWS", "POST / HTTP/1.1\r\n" + h + "Content-Length: \t5 \r\n\r\n", 0, 5, false, ""},
		{"chunked", "POST / HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\n\r\n", 0, -1, true, ""},
		{"chunked any case", "POST / HTTP/1.1\r\n" + h + "transfer-encoding: ChUnKeD\r\n\r\n", 0, -1, true, ""},
		{"HTTP/1.0 without Host", "GET / HTTP/1.0\r\n\r\n", 0, -1, false, ""},
		{"asterisk OPTIONS", "OPTIONS * HTTP/1.1\r\n" + h + "\r\n", 0, -1, false, ""},
		{"absolute-form", "GET http://other.example:81/p?q HTTP/1.1\r\n" + h + "\r\n", 0, -1, false, ""},
		{"Connection close, keep-alive, upgrade, te", "GET / HTTP/1.1\r\n" + h + "Connection: close, keep-alive, Upgrade, TE, X-Custom\r\n\r\n", 0, -1, false, ""},
		{"obs-text in value", "GET / HTTP/1.1\r\n" + h + "X: caf\xc3\xa9\r\n\r\n", 0, -1, false, ""},

		// §6.1, RFC 9110 §7.6.1: Connection naming framing or routing.
		{"Connection: Content-Length", "POST / HTTP/1.1\r\n" + h + "Connection: Content-Length\r\nContent-Length: 5\r\n\r\n", 400, 0, false, "Connection names"},
		{"Connection: transfer-encoding", "POST / HTTP/1.1\r\n" + h + "Connection: keep-alive, transfer-encoding\r\nTransfer-Encoding: chunked\r\n\r\n", 400, 0, false, "Connection names"},
		{"Connection: Host", "GET / HTTP/1.1\r\n" + h + "Connection: host\r\n\r\n", 400, 0, false, "Connection names"},
		{"Connection: Cookie", "GET / HTTP/1.1\r\n" + h + "Connection: Cookie\r\n\r\n", 400, 0, false, "Connection names"},
		{"Connection: X-Forwarded-For", "GET / HTTP/1.1\r\n" + h + "Connection: x-forwarded-for\r\n\r\n", 400, 0, false, "Connection names"},
		{"Connection: not a token", "GET / HTTP/1.1\r\n" + h + "Connection: a b\r\n\r\n", 400, 0, false, "malformed Connection"},

		// §5.1: no whitespace between name and colon; names are tokens.
		{"space before colon", "GET / HTTP/1.1\r\n" + h + "X-A : b\r\n\r\n", 400, 0, false, "whitespace between"},
		{"tab before colon", "GET / HTTP/1.1\r\n" + h + "Content-Length\t: 5\r\n\r\n", 400, 0, false, "whitespace between"},
		{"space in name", "GET / HTTP/1.1\r\n" + h + "X A: c\r\n\r\n", 400, 0, false, "field name"},
		{"no colon", "GET / HTTP/1.1\r\n" + h + "Nocolon\r\n\r\n", 400, 0, false, "field name"},
		{"empty name", "GET / HTTP/1.1\r\n" + h + ": v\r\n\r\n", 400, 0, false, "field name"},
		{"NUL in name", "GET / HTTP/1.1\r\n" + h + "X\x00Y: v\r\n\r\n", 400, 0, false, ""},
		{"NUL in value", "GET / HTTP/1.1\r\n" + h + "X: a\x00b\r\n\r\n", 400, 0, false, ""},
		{"control byte in value", "GET / HTTP/1.1\r\n" + h + "X: a\x01b\r\n\r\n", 400, 0, false, "control character"},
		{"DEL in value", "GET / HTTP/1.1\r\n" + h + "X: a\x7fb\r\n\r\n", 400, 0, false, "control character"},
		{"obs-fold", "GET / HTTP/1.1\r\n" + h + "X: a\r\n b\r\n\r\n", 400, 0, false, "folding"},

		// §2.2: line ends.
		{"bare LF mixed", "GET / HTTP/1.1\r\nHost: x\nX: y\r\n\r\n", 400, 0, false, "bare LF"},
		{"bare LF only", "GET / HTTP/1.1\nHost: x\n\n", 400, 0, false, "bare LF"},
		{"CRLF then LF end", "GET / HTTP/1.1\r\nHost: x\r\n\nGET /2 HTTP/1.1\r\n\r\n", 400, 0, false, "bare LF"},
		{"bare CR", "GET / HTTP/1.1\r\nHost: x\rX: y\r\n\r\n", 400, 0, false, "bare CR"},

		// §6.1-6.3, RFC 9110 §8.6: framing.
		{"CL and TE", "POST / HTTP/1.1\r\n" + h + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", 400, 0, false, "both"},
		{"TE and CL", "POST / HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", 400, 0, false, "both"},
		{"two CL differing", "POST / HTTP/1.1\r\n" + h + "Content-Length: 5\r\nContent-Length: 6\r\n\r\n", 400, 0, false, "more than one"},
		{"two CL same", "POST / HTTP/1.1\r\n" + h + "Content-Length: 5\r\nContent-Length: 5\r\n\r\n", 400, 0, false, "more than one"},
		{"CL list", "POST / HTTP/1.1\r\n" + h + "Content-Length: 5, 5\r\n\r\n", 400, 0, false, "Content-Length"},
		{"CL sign", "POST / HTTP/1.1\r\n" + h + "Content-Length: +5\r\n\r\n", 400, 0, false, "Content-Length"},
		{"CL negative", "POST / HTTP/1.1\r\n" + h + "Content-Length: -1\r\n\r\n", 400, 0, false, "Content-Length"},
		{"CL hex", "POST / HTTP/1.1\r\n" + h + "Content-Length: 0x5\r\n\r\n", 400, 0, false, "Content-Length"},
		{"CL overflow", "POST / HTTP/1.1\r\n" + h + "Content-Length: 99999999999999999999\r\n\r\n", 400, 0, false, "Content-Length"},
		{"CL empty", "POST / HTTP/1.1\r\n" + h + "Content-Length:\r\n\r\n", 400, 0, false, "Content-Length"},
		{"TE chunked, identity", "POST / HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked, identity\r\n\r\n", 400, 0, false, "other than chunked"},
		{"TE identity", "POST / HTTP/1.1\r\n" + h + "Transfer-Encoding: identity\r\n\r\n", 400, 0, false, "other than chunked"},
		{"TE gzip, chunked", "POST / HTTP/1.1\r\n" + h + "Transfer-Encoding: gzip, chunked\r\n\r\n", 400, 0, false, "other than chunked"},
		{"TE xchunked", "POST / HTTP/1.1\r\n" + h + "Transfer-Encoding: xchunked\r\n\r\n", 400, 0, false, "other than chunked"},
		{"TE twice", "POST / HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 400, 0, false, "more than one"},
		{"TE in HTTP/1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400, 0, false, "HTTP/1.0"},
		{"TE vertical tab", "POST / HTTP/1.1\r\n" + h + "Transfer-Encoding:\x0bchunked\r\n\r\n", 400, 0, false, ""},

		// §3.2: Host.
		{"1.1 without Host", "GET / HTTP/1.1\r\n\r\n", 400, 0, false, "without Host"},
		{"empty Host", "GET / HTTP/1.1\r\nHost:\r\n\r\n", 400, 0, false, "empty Host"},
		{"empty Host 1.0", "GET / HTTP/1.0\r\nHost: \r\n\r\n", 400, 0, false, "empty Host"},
		{"two Host", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, 0, false, "more than one Host"},
		{"Host with slash", "GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 400, 0, false, "Host"},
		{"Host with space", "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400, 0, false, "Host"},

		// §3: the request line and target.
		{"userinfo", "GET http://user:pw@other.example/ HTTP/1.1\r\n" + h + "\r\n", 400, 0, false, "userinfo"},
		{"asterisk with GET", "GET * HTTP/1.1\r\n" + h + "\r\n", 400, 0, false, "asterisk"},
		{"CONNECT", "CONNECT other.example:443 HTTP/1.1\r\n" + h + "\r\n", 501, 0, false, "CONNECT"},
		{"authority-form with GET", "GET other.example:443 HTTP/1.1\r\n" + h + "\r\n", 400, 0, false, ""},
		{"other scheme", "GET ftp://other.example/ HTTP/1.1\r\n" + h + "\r\n", 400, 0, false, ""},
		{"double space", "GET  / HTTP/1.1\r\n" + h + "\r\n", 400, 0, false, "request line"},
		{"trailing word", "GET / HTTP/1.1 x\r\n" + h + "\r\n", 400, 0, false, "request line"},
		{"lower-case version", "GET / http/1.1\r\n" + h + "\r\n", 400, 0, false, "request line"},
		{"HTTP/2.0", "GET / HTTP/2.0\r\n" + h + "\r\n", 505, 0, false, "version"},
		{"HTTP/1.2", "GET / HTTP/1.2\r\n" + h + "\r\n", 505, 0, false, "version"},
		{"method not a token", "G(T / HTTP/1.1\r\n" + h + "\r\n", 400, 0, false, "method"},
		{"raw UTF-8 target", "GET /caf\xc3\xa9 HTTP/1.1\r\n" + h + "\r\n", 400, 0, false, "target"},
		{"broken percent-encoding", "GET /a%4 HTTP/1.1\r\n" + h + "\r\n", 400, 0, false, "target"},
		{"percent-encoding", "GET /a%4f%20b HTTP/1.1\r\n" + h + "\r\n", 0, -1, false, ""},
		{"fragment in target", "GET /a#b HTTP/1.1\r\n" + h + "\r\n", 400, 0, false, "target"},
		{"DEL in target", "GET /a\x7fb HTTP/1.1\r\n" + h + "\r\n", 400, 0, false, "target"},
		{"leading empty line", "\r\nGET / HTTP/1.1\r\n" + h + "\r\n", 400, 0, false, "request line"},

		// Sizes.
		{"head too large", "GET / HTTP/1.1\r\n" + h + "X: " + strings.Repeat("a", maxHeadSize) + "\r\n\r\n", 431, 0, false, "too large"},
		{"target too long", "GET /" + strings.Repeat("a", maxHeadSize) + " HTTP/1.1\r\n" + h + "\r\n", 414, 0, false, "target too long"},
		{"target too long, line unended", "GET /" + strings.Repeat("a", maxHeadSize), 414, 0, false, "target too long"},
		{"long line, no method", strings.Repeat("a", maxHeadSize+1), 400, 0, false, "request line"},
		{"too many fields", "GET / HTTP/1.1\r\n" + h + strings.Repeat("X: a\r\n", maxHeaderFields) + "\r\n", 431, 0, false, "too many"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hi, err := checkHead([]byte(tc.head), nil)
			if tc.status == 0 {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if hi.n != len(tc.head) || hi.bodyLen != tc.bodyLen || hi.chunked != tc.chunked {
					t.Fatalf("got n=%d bodyLen=%d chunked=%v, want n=%d bodyLen=%d chunked=%v", hi.n, hi.bodyLen, hi.chunked, len(tc.head), tc.bodyLen, tc.chunked)
				}
				return
			}
			he, ok := err.(*headError)
			if !ok {
				t.Fatalf("got %v (%+v), want a refusal %d", err, hi, tc.status)
			}
			if he.status != tc.status || !strings.Contains(he.reason, tc.reason) {
				t.Fatalf("got %d %q, want %d containing %q", he.status, he.reason, tc.status, tc.reason)
			}
		})
	}
}

// TestCheckHeadIncomplete: every proper prefix of a valid head asks for
// more bytes; bytes after the head are not read.
func TestCheckHeadIncomplete(t *testing.T) {
	head := "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n"
	for i := range len(head) {
		if _, err := checkHead([]byte(head[:i]), nil); err != errHeadIncomplete {
			t.Fatalf("prefix %d: %v, want incomplete", i, err)
		}
	}
	hi, err := checkHead([]byte(head+"abcGARBAGE\n"), nil)
	if err != nil || hi.n != len(head) || hi.bodyLen != 3 {
		t.Fatalf("got %+v %v", hi, err)
	}
}

// TestCheckHeadHashHeader: Connection may not name the consistent-hash
// header either.
func TestCheckHeadHashHeader(t *testing.T) {
	head := []byte("GET / HTTP/1.1\r\nHost: x\r\nConnection: X-User\r\nX-User: a\r\n\r\n")
	if _, err := checkHead(head, nil); err != nil {
		t.Fatalf("without a hash header: %v", err)
	}
	if _, err := checkHead(head, []string{"x-user"}); err != errConnNominates {
		t.Fatalf("with hash header x-user: %v, want %v", err, errConnNominates)
	}
}

func TestSplitAbsolute(t *testing.T) {
	for _, tc := range []struct{ in, auth, target string }{
		{"http://a.example/p?q", "a.example", "/p?q"},
		{"http://a.example", "a.example", "/"},
		{"HTTPS://a.example:8443?q=1", "a.example:8443", "/?q=1"},
		{"http://[::1]:80/x", "[::1]:80", "/x"},
	} {
		auth, rest, ok := splitAbsolute([]byte(tc.in))
		if !ok || string(auth) != tc.auth || string(originForm(nil, rest)) != tc.target {
			t.Errorf("%s: %q %q %v, want %q %q", tc.in, auth, originForm(nil, rest), ok, tc.auth, tc.target)
		}
	}
	for _, in := range []string{"/p", "*", ""} {
		if _, _, ok := splitAbsolute([]byte(in)); ok {
			t.Errorf("%q: absolute", in)
		}
	}
}

func TestChunkScanStrict(t *testing.T) {
	for _, tc := range []struct {
		body string
		ok   bool
	}{
		{"5\r\nhello\r\n0\r\n\r\n", true},
		{"5;ext=1\r\nhello\r\n0\r\n\r\n", true},
		{"5\r\nhello\r\n0\r\nForwarded: for=6.6.6.6\r\n\r\n", false}, // a trailer field
		{"5\nhello\r\n0\r\n\r\n", false},                             // bare LF after the size
		{"5\r\nhello\n0\r\n\r\n", false},                             // bare LF after the data
		{"5\r\nhello\r\n0\r\n\n", false},                             // bare LF at the end
		{"5 \r\nhello\r\n0\r\n\r\n", false},                          // whitespace after the size
		{"5;a\nhello\r\n0\r\n\r\n", false},                           // bare LF in an extension
		{"5;a\x00\r\nhello\r\n0\r\n\r\n", false},                     // NUL in an extension
		{"ffffffffffffffffff\r\n", false},                            // size overflow
		{"0\r\nX: a\n\r\n", false},                                   // bare LF in a trailer
		{"0\r\n folded\r\n\r\n", false},                              // obs-fold in the trailer section
		{"\r\n", false},                                              // no size
	} {
		c := chunkScan{strict: true}
		n, done, err := c.feed([]byte(tc.body))
		if got := err == nil && done && n == len(tc.body); got != tc.ok {
			t.Errorf("%q: n=%d done=%v err=%v, want ok=%v", tc.body, n, done, err, tc.ok)
		}
	}
}

func BenchmarkCheckHead(b *testing.B) {
	head := []byte("GET /api/v1/items?id=42 HTTP/1.1\r\nHost: shop.example\r\nUser-Agent: wrk\r\nAccept: */*\r\nCookie: SLUICE=abcdefghijklmnopqrstuvwxyz0123456789\r\nConnection: keep-alive\r\n\r\n")
	b.ReportAllocs()
	b.SetBytes(int64(len(head)))
	for b.Loop() {
		if _, err := checkHead(head, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFasthttpHeadParse is the parse the loop does after checkHead,
// for scale.
func BenchmarkFasthttpHeadParse(b *testing.B) {
	head := []byte("GET /api/v1/items?id=42 HTTP/1.1\r\nHost: shop.example\r\nUser-Agent: wrk\r\nAccept: */*\r\nCookie: SLUICE=abcdefghijklmnopqrstuvwxyz0123456789\r\nConnection: keep-alive\r\n\r\n")
	var h fasthttp.RequestHeader
	var rd bytes.Reader
	br := bufio.NewReader(&rd)
	b.ReportAllocs()
	b.SetBytes(int64(len(head)))
	for b.Loop() {
		rd.Reset(head)
		br.Reset(&rd)
		if err := h.Read(br); err != nil {
			b.Fatal(err)
		}
	}
}
