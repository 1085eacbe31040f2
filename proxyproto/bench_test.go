package proxyproto

import (
	"net/netip"
	"testing"
)

func BenchmarkParse(b *testing.B) {
	for _, bc := range []struct {
		name string
		in   []byte
	}{
		{"v1-tcp4", []byte("PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\n")},
		{"v1-tcp6", []byte("PROXY TCP6 2001:db8:85a3::8a2e:370:7334 2001:db8::2 56324 443\r\n")},
		{"v2-tcp4", v2(0x21, 0x11, v4Payload...)},
		{"v2-tcp6", AppendV2(nil, netip.MustParseAddrPort("[2001:db8::1]:1"), netip.MustParseAddrPort("[2001:db8::2]:2"))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := Parse(bc.in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkAppendV2(b *testing.B) {
	src, dst := netip.MustParseAddrPort("127.0.0.2:40000"), netip.MustParseAddrPort("127.0.0.1:80")
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendV2(buf[:0], src, dst)
	}
}
