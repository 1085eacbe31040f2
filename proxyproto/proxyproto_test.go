package proxyproto

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// v2 builds a v2 header from its version/command, family byte, and payload.
func v2(vc, fam byte, payload ...byte) []byte {
	b := append([]byte{}, v2Sig[:]...)
	b = append(b, vc, fam, byte(len(payload)>>8), byte(len(payload)))
	return append(b, payload...)
}

var v4Payload = []byte{127, 0, 0, 2, 127, 0, 0, 1, 0x9c, 0x40, 0x1f, 0x90} // 127.0.0.2:40000 -> 127.0.0.1:8080

func TestParse(t *testing.T) {
	v6Payload := append(append(append([]byte{}, netip.MustParseAddr("2001:db8::1").AsSlice()...), netip.MustParseAddr("2001:db8::2").AsSlice()...), 0, 80, 1, 187)
	long := v2(0x21, 0x11, make([]byte, MaxV2Payload+1)...)
	tests := []struct {
		name string
		in   string
		want Header
		n    int
		err  error
	}{
		{"v1 tcp4", "PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\nGET /", Header{1, Proxy, ap("192.0.2.1:56324"), ap("198.51.100.2:443")}, 45, nil},
		{"v1 tcp6", "PROXY TCP6 2001:db8::1 ::ffff:10.0.0.1 1 65535\r\n", Header{1, Proxy, ap("[2001:db8::1]:1"), ap("[::ffff:10.0.0.1]:65535")}, 48, nil},
		{"v1 tcp6 full", "PROXY TCP6 2001:0db8:0000:0000:0000:0000:0000:0001 :: 0 0\r\n", Header{1, Proxy, ap("[2001:db8::1]:0"), ap("[::]:0")}, 59, nil},
		{"v1 unknown", "PROXY UNKNOWN\r\n", Header{1, Proxy, netip.AddrPort{}, netip.AddrPort{}}, 15, nil},
		{"v1 unknown with addresses", "PROXY UNKNOWN ffff:f...f ffff 1 2\r\nX", Header{Version: 1, Command: Proxy}, 35, nil},
		{"v1 incomplete", "PROXY TCP4 192.0.2.1 198.51", Header{}, 0, ErrIncomplete},
		{"v1 incomplete sig", "PRO", Header{}, 0, ErrIncomplete},
		{"empty", "", Header{}, 0, ErrIncomplete},
		{"not a header", "GET / HTTP/1.1\r\n", Header{}, 0, ErrMissing},
		{"P but not PROXY", "POST / HTTP/1.1\r\n", Header{}, 0, ErrMissing},
		{"v1 lowercase", "proxy TCP4 1.1.1.1 1.1.1.1 1 1\r\n", Header{}, 0, ErrMissing},
		{"v1 too long", "PROXY TCP6 " + string(bytes.Repeat([]byte{'a'}, 100)), Header{}, 0, ErrV1TooLong},
		{"v1 LF only", "PROXY TCP4 1.1.1.1 1.1.1.1 1 1\n", Header{}, 0, ErrV1BadEnd},
		{"v1 UDP4", "PROXY UDP4 1.1.1.1 1.1.1.1 1 1\r\n", Header{}, 0, ErrV1Family},
		{"v1 missing port", "PROXY TCP4 1.1.1.1 1.1.1.1 1\r\n", Header{}, 0, ErrV1Fields},
		{"v1 extra field", "PROXY TCP4 1.1.1.1 1.1.1.1 1 2 3\r\n", Header{}, 0, ErrV1Fields},
		{"v1 double space", "PROXY TCP4 1.1.1.1  1.1.1.1 1 2\r\n", Header{}, 0, ErrV1Fields},
		{"v1 trailing space", "PROXY TCP4 1.1.1.1 1.1.1.1 1 2 \r\n", Header{}, 0, ErrV1Fields},
		{"v1 v6 in TCP4", "PROXY TCP4 ::1 ::1 1 2\r\n", Header{}, 0, ErrV1Address},
		{"v1 v4 in TCP6", "PROXY TCP6 1.1.1.1 1.1.1.1 1 2\r\n", Header{}, 0, ErrV1Address},
		{"v1 octet 256", "PROXY TCP4 1.1.1.256 1.1.1.1 1 2\r\n", Header{}, 0, ErrV1Address},
		{"v1 leading zero octet", "PROXY TCP4 1.1.1.01 1.1.1.1 1 2\r\n", Header{}, 0, ErrV1Address},
		{"v1 three octets", "PROXY TCP4 1.1.1 1.1.1.1 1 2\r\n", Header{}, 0, ErrV1Address},
		{"v1 zone", "PROXY TCP6 fe80::1%eth0 ::1 1 2\r\n", Header{}, 0, ErrV1Address},
		{"v1 two ellipses", "PROXY TCP6 1::2::3 ::1 1 2\r\n", Header{}, 0, ErrV1Address},
		{"v1 nine groups", "PROXY TCP6 1:2:3:4:5:6:7:8:9 ::1 1 2\r\n", Header{}, 0, ErrV1Address},
		{"v1 group of 5", "PROXY TCP6 12345::1 ::1 1 2\r\n", Header{}, 0, ErrV1Address},
		{"v1 port 65536", "PROXY TCP4 1.1.1.1 1.1.1.1 65536 2\r\n", Header{}, 0, ErrV1Port},
		{"v1 port sign", "PROXY TCP4 1.1.1.1 1.1.1.1 +1 2\r\n", Header{}, 0, ErrV1Port},
		{"v1 port leading zero", "PROXY TCP4 1.1.1.1 1.1.1.1 01 2\r\n", Header{}, 0, ErrV1Port},
		{"v2 tcp4", string(v2(0x21, 0x11, v4Payload...)) + "GET", Header{2, Proxy, ap("127.0.0.2:40000"), ap("127.0.0.1:8080")}, 28, nil},
		{"v2 tcp6", string(v2(0x21, 0x21, v6Payload...)), Header{2, Proxy, ap("[2001:db8::1]:80"), ap("[2001:db8::2]:443")}, 52, nil},
		{"v2 tcp4 with TLV", string(v2(0x21, 0x11, append(append([]byte{}, v4Payload...), 0x04, 0, 1, 'x')...)), Header{2, Proxy, ap("127.0.0.2:40000"), ap("127.0.0.1:8080")}, 32, nil},
		{"v2 local", string(v2(0x20, 0x00)), Header{Version: 2, Command: Local}, 16, nil},
		{"v2 local with addresses", string(v2(0x20, 0x11, v4Payload...)), Header{Version: 2, Command: Local}, 28, nil},
		{"v2 proxy unspec", string(v2(0x21, 0x00)), Header{Version: 2, Command: Proxy}, 16, nil},
		{"v2 proxy unix", string(v2(0x21, 0x31, make([]byte, 216)...)), Header{Version: 2, Command: Proxy}, 232, nil},
		{"v2 udp4", string(v2(0x21, 0x12, v4Payload...)), Header{2, Proxy, ap("127.0.0.2:40000"), ap("127.0.0.1:8080")}, 28, nil},
		{"v2 sig only", string(v2Sig[:]), Header{}, 0, ErrIncomplete},
		{"v2 address cut", string(v2(0x21, 0x11, v4Payload...)[:20]), Header{}, 0, ErrIncomplete},
		{"v2 bad sig", "\r\n\r\n\x00\r\nX", Header{}, 0, ErrMissing},
		{"v2 version 1", string(v2(0x11, 0x11, v4Payload...)), Header{}, 0, ErrV2Version},
		{"v2 command 2", string(v2(0x22, 0x11, v4Payload...)), Header{}, 0, ErrV2Command},
		{"v2 family 4", string(v2(0x21, 0x41, v4Payload...)), Header{}, 0, ErrV2Family},
		{"v2 transport 3", string(v2(0x21, 0x13, v4Payload...)), Header{}, 0, ErrV2Family},
		{"v2 inet short", string(v2(0x21, 0x11, v4Payload[:11]...)), Header{}, 0, ErrV2Short},
		{"v2 inet6 short", string(v2(0x21, 0x21, v4Payload...)), Header{}, 0, ErrV2Short},
		{"v2 too long", string(long[:V2HeaderLen]), Header{}, 0, ErrV2TooLong},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, n, err := Parse([]byte(tc.in))
			if err != tc.err {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if h != tc.want || n != tc.n {
				t.Fatalf("got %+v n=%d, want %+v n=%d", h, n, tc.want, tc.n)
			}
			if err == nil {
				// Every shorter prefix is incomplete, never an error.
				for i := range n {
					if _, _, err := Parse([]byte(tc.in[:i])); err != ErrIncomplete {
						t.Fatalf("prefix %d: err = %v, want ErrIncomplete", i, err)
					}
				}
			}
		})
	}
}

func TestAppendGolden(t *testing.T) {
	tests := []struct {
		v        uint8
		src, dst netip.AddrPort
		want     string
	}{
		{1, ap("127.0.0.2:40000"), ap("127.0.0.1:8080"), "PROXY TCP4 127.0.0.2 127.0.0.1 40000 8080\r\n"},
		{1, ap("[::ffff:127.0.0.2]:1"), ap("127.0.0.1:0"), "PROXY TCP4 127.0.0.2 127.0.0.1 1 0\r\n"},
		{1, ap("[2001:db8::1]:1"), ap("127.0.0.1:2"), "PROXY TCP6 2001:db8::1 ::ffff:127.0.0.1 1 2\r\n"},
		{1, netip.AddrPort{}, ap("127.0.0.1:2"), "PROXY UNKNOWN\r\n"},
		{2, ap("127.0.0.2:40000"), ap("127.0.0.1:8080"), string(v2(0x21, 0x11, v4Payload...))},
		{2, netip.AddrPort{}, netip.AddrPort{}, string(v2(0x20, 0x00))},
	}
	for _, tc := range tests {
		got := Append(nil, tc.v, tc.src, tc.dst)
		if string(got) != tc.want {
			t.Errorf("Append(v%d, %v, %v) = %q, want %q", tc.v, tc.src, tc.dst, got, tc.want)
		}
		h, n, err := Parse(got)
		if err != nil || n != len(got) || h.Version != tc.v {
			t.Errorf("Parse(Append(v%d)) = %+v, %d, %v", tc.v, h, n, err)
		}
		if tc.src.IsValid() && h.Client(netip.AddrPort{}).Addr().Unmap() != tc.src.Addr().Unmap() {
			t.Errorf("v%d round trip: client %v, want %v", tc.v, h.Source, tc.src)
		}
	}
	// IPv6 round trip of v2.
	h, _, err := Parse(AppendV2(nil, ap("[2001:db8::7]:9"), ap("[::1]:10")))
	if err != nil || h.Source != ap("[2001:db8::7]:9") || h.Dest != ap("[::1]:10") {
		t.Fatalf("v2 IPv6 round trip: %+v %v", h, err)
	}
}

func TestSniff(t *testing.T) {
	for in, want := range map[string]bool{
		"": false, "P": false, "PROXY": false, "PROXY ": true, "PROXY TCP4": true, "POST": false,
		"GET": false, "\r\n\r\n": false, "\r\n\r\n\x00": true, string(v2Sig[:]) + "!": true, "\r\n\r\nINVITE": false,
	} {
		if got := Sniff([]byte(in)); got != want {
			t.Errorf("Sniff(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestSniffRecord(t *testing.T) {
	for in, want := range map[string]bool{"PROXY": true, "\r\n\r\n\x00": true, "\x16\x03\x01\x00\x10": false, "GET /": false} {
		if got := SniffRecord([5]byte([]byte(in))); got != want {
			t.Errorf("SniffRecord(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestRejectedAndTrusted(t *testing.T) {
	var r Rejected
	r.Add(ReasonTimeout)
	r.Add(ReasonTimeout)
	r.Add("other")
	if r.Get(ReasonTimeout) != 2 || r.Get(ReasonMalformed) != 1 || r.Get(ReasonUntrusted) != 0 {
		t.Fatalf("counts: timeout %d malformed %d", r.Get(ReasonTimeout), r.Get(ReasonMalformed))
	}
	tr := Trusted{netip.MustParsePrefix("10.0.0.0/8")}
	if !tr.Contains(netip.MustParseAddr("::ffff:10.1.2.3")) || tr.Contains(netip.MustParseAddr("11.0.0.1")) {
		t.Fatal("Trusted.Contains")
	}
}

func TestParseTrusted(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{in: "10.0.0.0/8", want: "[10.0.0.0/8]"},
		{in: "10.1.2.3/8, 192.0.2.10", want: "[10.0.0.0/8 192.0.2.10/32]"},
		{in: "::ffff:10.0.0.0/104", want: "[10.0.0.0/8]"},
		{in: "2001:db8::/32", want: "[2001:db8::/32]"},
		{in: "10.0.0.0/33", err: `-proxy-protocol-from "10.0.0.0/33": "10.0.0.0/33" is not a CIDR or an address`},
		{in: "lb.example", err: `"lb.example" is not a CIDR or an address`},
		{in: " , ", err: "no CIDR or address"},
	} {
		got, err := ParseTrusted(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseTrusted(%q) = %v, %v; want error %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || fmt.Sprint([]netip.Prefix(got)) != tc.want {
			t.Errorf("ParseTrusted(%q) = %v, %v; want %s", tc.in, got, err, tc.want)
		}
	}
}

func TestClient(t *testing.T) {
	peer := ap("10.0.0.1:5")
	if got := (Header{Version: 2, Command: Local, Source: ap("1.1.1.1:1")}).Client(peer); got != peer {
		t.Errorf("LOCAL: client %v, want the peer", got)
	}
	if got := (Header{Version: 1, Command: Proxy}).Client(peer); got != peer {
		t.Errorf("UNKNOWN: client %v, want the peer", got)
	}
	if got := (Header{Version: 1, Command: Proxy, Source: ap("1.1.1.1:1")}).Client(peer); got != ap("1.1.1.1:1") {
		t.Errorf("PROXY: client %v", got)
	}
}

// oneByteReader returns at most one byte per Read and counts reads past
// the header.
type oneByteReader struct{ r io.Reader }

func (o oneByteReader) Read(p []byte) (int, error) { return o.r.Read(p[:min(1, len(p))]) }

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

type errAfter struct {
	b   []byte
	err error
}

func (e *errAfter) Read(p []byte) (int, error) {
	if len(e.b) == 0 {
		return 0, e.err
	}
	n := copy(p, e.b)
	e.b = e.b[n:]
	return n, nil
}

func TestRead(t *testing.T) {
	v1 := "PROXY TCP4 127.0.0.2 127.0.0.1 40000 8080\r\n"
	tests := []struct {
		name   string
		r      func(string) io.Reader
		in     string
		want   Header
		err    error
		reason string
	}{
		{"v1", func(s string) io.Reader { return bytes.NewReader([]byte(s)) }, v1 + "REST", Header{1, Proxy, ap("127.0.0.2:40000"), ap("127.0.0.1:8080")}, nil, ""},
		{"v1 bytewise", func(s string) io.Reader { return oneByteReader{bytes.NewReader([]byte(s))} }, v1 + "REST", Header{1, Proxy, ap("127.0.0.2:40000"), ap("127.0.0.1:8080")}, nil, ""},
		{"v1 unknown", func(s string) io.Reader { return bytes.NewReader([]byte(s)) }, "PROXY UNKNOWN\r\nREST", Header{Version: 1, Command: Proxy}, nil, ""},
		{"v2", func(s string) io.Reader { return bytes.NewReader([]byte(s)) }, string(v2(0x21, 0x11, v4Payload...)) + "REST", Header{2, Proxy, ap("127.0.0.2:40000"), ap("127.0.0.1:8080")}, nil, ""},
		{"v2 local", func(s string) io.Reader { return oneByteReader{bytes.NewReader([]byte(s))} }, string(v2(0x20, 0)) + "REST", Header{Version: 2, Command: Local}, nil, ""},
		// Lengths whose bits overlap 16's (17, 16+TLV) once made Read spin.
		{"v2 unspec length 17", func(s string) io.Reader { return bytes.NewReader([]byte(s)) }, string(v2(0x21, 0x00, make([]byte, 17)...)) + "REST", Header{Version: 2, Command: Proxy}, nil, ""},
		{"v2 with TLV", func(s string) io.Reader { return bytes.NewReader([]byte(s)) }, string(v2(0x21, 0x11, append(append([]byte{}, v4Payload...), 0x04, 0, 1, 'x')...)) + "REST", Header{2, Proxy, ap("127.0.0.2:40000"), ap("127.0.0.1:8080")}, nil, ""},
		{"missing", func(s string) io.Reader { return bytes.NewReader([]byte(s)) }, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", Header{}, ErrMissing, ReasonMissing},
		{"short missing", func(s string) io.Reader { return bytes.NewReader([]byte(s)) }, "GET /", Header{}, ErrMissing, ReasonMissing},
		{"truncated v1", func(s string) io.Reader { return bytes.NewReader([]byte(s)) }, v1[:30], Header{}, ErrTruncated, ReasonTruncated},
		{"truncated v2", func(s string) io.Reader { return bytes.NewReader([]byte(s)) }, string(v2(0x21, 0x11, v4Payload...)[:20]), Header{}, ErrTruncated, ReasonTruncated},
		{"malformed", func(s string) io.Reader { return bytes.NewReader([]byte(s)) }, "PROXY TCP4 1.1.1.1 1.1.1.1 1 99999\r\nREST", Header{}, ErrV1Port, ReasonMalformed},
		{"timeout", func(s string) io.Reader { return &errAfter{[]byte(s), timeoutErr{}} }, v1[:20], Header{}, timeoutErr{}, ReasonTimeout},
		{"deadline", func(s string) io.Reader { return &errAfter{[]byte(s), os.ErrDeadlineExceeded} }, "", Header{}, os.ErrDeadlineExceeded, ReasonTimeout},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.r(tc.in)
			h, err := Read(r, make([]byte, MaxLen))
			if !errors.Is(err, tc.err) && err != tc.err {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if h != tc.want {
				t.Fatalf("header %+v, want %+v", h, tc.want)
			}
			if err != nil {
				if got := Reason(err); got != tc.reason {
					t.Fatalf("Reason = %q, want %q", got, tc.reason)
				}
				return
			}
			rest, _ := io.ReadAll(r)
			if string(rest) != "REST" {
				t.Fatalf("bytes after the header: %q, want REST (Read read past the header)", rest)
			}
		})
	}
}

// countingReader counts the reads Read makes.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) { c.n++; return c.r.Read(p) }

// TestReadNeverPastHeader: for v1 headers of every shape Read stops at
// the CRLF, whatever follows, in a few reads.
func TestReadNeverPastHeader(t *testing.T) {
	for _, hdr := range []string{
		"PROXY TCP4 1.1.1.1 1.1.1.1 1 1\r\n",
		"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\n",
		"PROXY TCP4 255.255.255.255 255.255.255.255 65535 65535\r\n",
		"PROXY TCP6 :: :: 0 0\r\n",
		"PROXY TCP6 ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n",
		"PROXY UNKNOWN\r\n",
		"PROXY UNKNOWN x y z\r\n",
	} {
		for _, rest := range []string{"", "G", "GET / HTTP/1.1\r\n\r\n"} {
			cr := &countingReader{r: bytes.NewReader([]byte(hdr + rest))}
			if _, err := Read(cr, nil); err != nil {
				t.Fatalf("%q: %v", hdr, err)
			}
			left, _ := io.ReadAll(cr.r)
			if string(left) != rest {
				t.Fatalf("%q: left %q, want %q", hdr, left, rest)
			}
			if cr.n > 20 {
				t.Errorf("%q: %d reads", hdr, cr.n)
			}
		}
	}
}

func TestParseAllocs(t *testing.T) {
	ins := [][]byte{
		[]byte("PROXY TCP6 2001:db8:1:2:3:4:5:6 2001:db8::ffff:1.2.3.4 65535 443\r\n"),
		[]byte("PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\n"),
		v2(0x21, 0x11, v4Payload...),
		[]byte("PROXY TCP4 1.1.1.1 1.1.1.1 1 99999\r\n"),
	}
	for _, in := range ins {
		if a := testing.AllocsPerRun(100, func() { Parse(in) }); a != 0 {
			t.Errorf("Parse(%q) allocates %v times", in, a)
		}
	}
}

// TestReadDeadline reads from a pipe whose writer sends half a header:
// the deadline ends Read with a timeout.
func TestReadDeadline(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	w.Write([]byte("PROXY TCP4 1.1.1.1"))
	r.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, err = Read(r, nil)
	if Reason(err) != ReasonTimeout {
		t.Fatalf("err %v (reason %q), want a timeout", err, Reason(err))
	}
}
