package proxyproto

import (
	"bytes"
	"net/netip"
	"testing"
)

// FuzzParse: Parse never panics, never reads past its input, says a
// length within it, and a header it accepts parses the same from any
// longer input; a header written back parses to the same client.
func FuzzParse(f *testing.F) {
	f.Add([]byte("PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\n"))
	f.Add([]byte("PROXY TCP6 2001:db8::1 ::ffff:1.2.3.4 1 2\r\n"))
	f.Add([]byte("PROXY UNKNOWN\r\n"))
	f.Add(v2(0x21, 0x11, v4Payload...))
	f.Add(v2(0x20, 0x00))
	f.Add(v2(0x21, 0x21, make([]byte, 36)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, n, err := Parse(b)
		if err != nil {
			if n != 0 || h != (Header{}) {
				t.Fatalf("error %v with n=%d h=%+v", err, n, h)
			}
			if err == ErrIncomplete && len(b) >= MaxLen {
				t.Fatalf("incomplete after %d bytes", len(b))
			}
			return
		}
		if n <= 0 || n > len(b) || n > MaxLen {
			t.Fatalf("n=%d of %d bytes", n, len(b))
		}
		h2, n2, err := Parse(append(bytes.Clone(b[:n]), "trailing"...))
		if err != nil || h2 != h || n2 != n {
			t.Fatalf("with trailing bytes: %+v %d %v, want %+v %d", h2, n2, err, h, n)
		}
		if h.Source.IsValid() {
			out := Append(nil, h.Version, h.Source, h.Dest)
			h3, _, err := Parse(out)
			if err != nil || h3.Source.Addr().Unmap() != h.Source.Addr().Unmap() || h3.Source.Port() != h.Source.Port() {
				t.Fatalf("rewritten %q: %+v %v, want source %v", out, h3, err, h.Source)
			}
			if h.Version == 1 {
				// Text addresses agree with the standard library's parser.
				want, perr := netip.ParseAddr(h.Source.Addr().String())
				if perr != nil || want != h.Source.Addr() {
					t.Fatalf("address %v does not round-trip through netip", h.Source.Addr())
				}
			}
		}
	})
}

// FuzzParseIPv6 compares the header's IPv6 parser with netip's.
func FuzzParseIPv6(f *testing.F) {
	for _, s := range []string{"::", "::1", "1::", "2001:db8::1", "1:2:3:4:5:6:7:8", "::ffff:1.2.3.4", "1:2:3:4:5:6:1.2.3.4", "fe80::1%eth0", "1::2::3", ":1", "1:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var a [16]byte
		ok := parseIPv6([]byte(s), &a)
		want, err := netip.ParseAddr(s)
		wantOK := err == nil && want.Is6() && want.Zone() == "" && len(s) <= 45
		if ok != wantOK {
			t.Fatalf("parseIPv6(%q) = %v, netip says %v (%v)", s, ok, wantOK, err)
		}
		if ok && netip.AddrFrom16(a) != want {
			t.Fatalf("parseIPv6(%q) = %v, want %v", s, netip.AddrFrom16(a), want)
		}
	})
}

// FuzzRead: Read never panics and, when it returns a header, has read
// exactly the bytes Parse says the header has, whatever follows.
func FuzzRead(f *testing.F) {
	f.Add([]byte("PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\nGET /"))
	f.Add([]byte("PROXY UNKNOWN x\r\n\r\n"))
	f.Add(append(v2(0x21, 0x11, v4Payload...), "rest"...))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		h, err := Read(r, nil)
		if err != nil {
			return
		}
		ph, n, perr := Parse(b)
		if perr != nil || ph != h {
			t.Fatalf("Read %+v, Parse %+v %v", h, ph, perr)
		}
		if read := len(b) - r.Len(); read != n {
			t.Fatalf("Read consumed %d bytes, the header has %d", read, n)
		}
	})
}
