// Package proxyproto reads and writes the PROXY protocol header (HAProxy's
// "PROXY protocol" versions 1 and 2): the few bytes a layer-4 balancer
// puts at the start of a TCP connection to say which client it carries,
// since the connection's own peer address is the balancer's.
//
// Parse reads a header from the bytes received so far, without allocating
// and without reading past it, and tells "not yet complete" (ErrIncomplete)
// apart from each way a header can be wrong (an *Error with its Reason), so
// an event loop can parse as bytes arrive and a goroutine can read exactly
// the header's bytes (Read). AppendV1 and AppendV2 write a header for a
// connection to a backend.
//
// The package imports only the standard library.
package proxyproto

import (
	"encoding/binary"
	"errors"
	"net/netip"
)

// Command is what a header says about its connection.
type Command uint8

const (
	// Local: the connection is the balancer's own (a health check); the
	// peer address stays the connection's.
	Local Command = 0
	// Proxy: the connection carries a client, named by the header.
	Proxy Command = 1
)

// Header is a parsed PROXY header.
type Header struct {
	Version uint8 // 1 or 2
	Command Command
	// Source and Dest are the client's address and the address it
	// connected to. They are valid only when the header names a TCP/UDP
	// client over IPv4 or IPv6; a LOCAL command, v1's UNKNOWN and v2's
	// UNSPEC and UNIX families leave them zero, and the connection's own
	// addresses stand.
	Source, Dest netip.AddrPort
}

// Client returns the address the header carries, or peer when it carries
// none (LOCAL, UNKNOWN, UNSPEC, UNIX).
func (h Header) Client(peer netip.AddrPort) netip.AddrPort {
	if h.Command == Proxy && h.Source.IsValid() {
		return h.Source
	}
	return peer
}

// Sizes of a header.
const (
	// MaxV1Len is the longest v1 header the protocol allows, CRLF included.
	MaxV1Len = 107
	// MinV1Len is the shortest v1 header ("PROXY UNKNOWN\r\n").
	MinV1Len = 15
	// V2HeaderLen is v2's fixed part: signature, version and command,
	// family, length.
	V2HeaderLen = 16
	// MaxV2Payload is the longest v2 address block and TLVs accepted: the
	// protocol allows 65,535 bytes, but the TLVs balancers send (AWS's VPC
	// endpoint id, GCP's, a TLS client's details) fit in far less, and a
	// peer must not make sluice hold 64 KiB per connection before it has
	// said anything.
	MaxV2Payload = 1024
	// MaxLen is the longest header Parse accepts, of either version.
	MaxLen = V2HeaderLen + MaxV2Payload
)

// v2Sig is the 12 bytes that start a v2 header.
var v2Sig = [12]byte{'\r', '\n', '\r', '\n', 0, '\r', '\n', 'Q', 'U', 'I', 'T', '\n'}

var v1Sig = [6]byte{'P', 'R', 'O', 'X', 'Y', ' '}

// ErrIncomplete: the bytes given are the start of a header that may still
// be valid; more are needed.
var ErrIncomplete = errors.New("proxyproto: header incomplete")

// Error is a header that cannot be valid, whatever comes next.
type Error struct {
	Msg string
}

func (e *Error) Error() string { return "proxyproto: " + e.Msg }

// Reason is the metrics label of a refused header, one of "missing"
// (the connection does not start with a PROXY signature), "malformed"
// (it does, but the header is wrong), "truncated" (the connection ended
// within it), "timeout" (it did not come in time) and "untrusted" (a
// header from a source not allowed to send one).
const (
	ReasonMissing   = "missing"
	ReasonMalformed = "malformed"
	ReasonTruncated = "truncated"
	ReasonTimeout   = "timeout"
	ReasonUntrusted = "untrusted"
)

// The ways a header can be wrong. They are values, so Parse allocates
// nothing to say which.
var (
	ErrMissing   = &Error{"no PROXY header: the connection does not start with \"PROXY \" or the v2 signature"}
	ErrV1TooLong = &Error{"v1 header longer than 107 bytes without CRLF"}
	ErrV1BadEnd  = &Error{"v1 header line ends with LF without CR"}
	ErrV1Family  = &Error{"v1 protocol is not TCP4, TCP6 or UNKNOWN"}
	ErrV1Fields  = &Error{"v1 header does not have 4 single-space separated fields after the protocol"}
	ErrV1Address = &Error{"v1 address is not an address of the protocol's family"}
	ErrV1Port    = &Error{"v1 port is not a decimal number 0-65535"}
	ErrV2Version = &Error{"v2 header version is not 2"}
	ErrV2Command = &Error{"v2 command is not LOCAL or PROXY"}
	ErrV2Family  = &Error{"v2 address family or transport is not one the protocol defines"}
	ErrV2Short   = &Error{"v2 header length is shorter than its address family needs"}
	ErrV2TooLong = &Error{"v2 header length over 1024 bytes"}
)

// Reason returns the metrics label for an error of Parse or Read:
// ReasonMissing, ReasonMalformed, ReasonTruncated or ReasonTimeout.
func Reason(err error) string {
	switch {
	case err == ErrMissing:
		return ReasonMissing
	case errors.Is(err, ErrIncomplete), errors.Is(err, errTruncated):
		return ReasonTruncated
	case isTimeout(err):
		return ReasonTimeout
	}
	return ReasonMalformed
}

// Sniff reports whether b, the first bytes of a connection, start with a
// PROXY header's signature: "PROXY " (6 bytes) or the first 5 bytes of
// v2's (CRLFCRLF NUL). A front end refuses such a connection from a
// source not allowed to send one; with fewer bytes it says false.
func Sniff(b []byte) bool {
	if len(b) >= len(v1Sig) && string(b[:len(v1Sig)]) == string(v1Sig[:]) {
		return true
	}
	// CRLFCRLF is also a SIP keep-alive or empty lines: only the fifth
	// byte (NUL) says v2.
	return len(b) >= 5 && string(b[:5]) == string(v2Sig[:5])
}

// SniffRecord reports whether the 5 bytes a TLS server read as a record
// header (tls.RecordHeaderError.RecordHeader) are the start of a PROXY
// header: "PROXY" or CRLFCRLF NUL. A TLS listener tells a forged header
// from a handshake gone wrong by it.
func SniffRecord(h [5]byte) bool {
	return string(h[:]) == "PROXY" || string(h[:]) == string(v2Sig[:5])
}

// Parse reads the header at the start of b. It returns the header and its
// length in bytes; ErrIncomplete when b is a valid start of a header that
// needs more bytes; an *Error when b cannot start a valid header. It reads
// no byte past the header and allocates nothing.
func Parse(b []byte) (Header, int, error) {
	if len(b) == 0 {
		return Header{}, 0, ErrIncomplete
	}
	if b[0] == 'P' {
		return parseV1(b)
	}
	if b[0] == '\r' {
		return parseV2(b)
	}
	return Header{}, 0, ErrMissing
}

func parseV1(b []byte) (Header, int, error) {
	n := min(len(b), len(v1Sig))
	if string(b[:n]) != string(v1Sig[:n]) {
		return Header{}, 0, ErrMissing
	}
	end := -1
	for i := 0; i < len(b) && i < MaxV1Len; i++ {
		if b[i] == '\n' {
			end = i
			break
		}
	}
	if end < 0 {
		if len(b) >= MaxV1Len {
			return Header{}, 0, ErrV1TooLong
		}
		return Header{}, 0, ErrIncomplete
	}
	if end == 0 || b[end-1] != '\r' {
		return Header{}, 0, ErrV1BadEnd
	}
	line := b[len(v1Sig) : end-1]
	h := Header{Version: 1, Command: Proxy}
	proto, rest, _ := cut(line)
	switch string(proto) {
	case "UNKNOWN":
		// The rest of the line says nothing to be relied on (the spec
		// lets a sender put anything there).
		return Header{Version: 1, Command: Proxy}, end + 1, nil
	case "TCP4", "TCP6":
	default:
		return Header{}, 0, ErrV1Family
	}
	var f [4][]byte
	for i := range f {
		var ok bool
		f[i], rest, ok = cut(rest)
		if len(f[i]) == 0 || ok != (i < 3) {
			return Header{}, 0, ErrV1Fields
		}
	}
	src, ok1 := parseAddr(f[0], proto[3] == '4')
	dst, ok2 := parseAddr(f[1], proto[3] == '4')
	if !ok1 || !ok2 {
		return Header{}, 0, ErrV1Address
	}
	sp, ok1 := parsePort(f[2])
	dp, ok2 := parsePort(f[3])
	if !ok1 || !ok2 {
		return Header{}, 0, ErrV1Port
	}
	h.Source = netip.AddrPortFrom(src, sp)
	h.Dest = netip.AddrPortFrom(dst, dp)
	return h, end + 1, nil
}

// cut splits b at its first space: the field before, what follows, and
// whether there was a space.
func cut(b []byte) (field, rest []byte, found bool) {
	for i, c := range b {
		if c == ' ' {
			return b[:i], b[i+1:], true
		}
	}
	return b, nil, false
}

// parsePort reads a decimal port of 1-5 digits up to 65535.
func parsePort(b []byte) (uint16, bool) {
	if len(b) == 0 || len(b) > 5 || (len(b) > 1 && b[0] == '0') {
		return 0, false
	}
	v := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int(c-'0')
	}
	if v > 65535 {
		return 0, false
	}
	return uint16(v), true
}

// parseAddr reads an IPv4 (v4) or IPv6 address in text, without a zone;
// it allocates nothing.
func parseAddr(b []byte, v4 bool) (netip.Addr, bool) {
	if v4 {
		var a [4]byte
		if !parseIPv4(b, a[:]) {
			return netip.Addr{}, false
		}
		return netip.AddrFrom4(a), true
	}
	var a [16]byte
	if !parseIPv6(b, &a) {
		return netip.Addr{}, false
	}
	return netip.AddrFrom16(a), true
}

// parseIPv4 reads dotted-decimal b (four parts 0-255, no leading zeros)
// into out.
func parseIPv4(b []byte, out []byte) bool {
	part, digits, v := 0, 0, 0
	for i := 0; i <= len(b); i++ {
		if i == len(b) || b[i] == '.' {
			if digits == 0 || part > 3 {
				return false
			}
			out[part] = byte(v)
			part++
			digits, v = 0, 0
			continue
		}
		c := b[i]
		if c < '0' || c > '9' || (digits == 1 && v == 0) {
			return false
		}
		v = v*10 + int(c-'0')
		digits++
		if v > 255 {
			return false
		}
	}
	return part == 4
}

// parseIPv6 reads an RFC 4291 text address (hex groups, one "::", an
// IPv4 tail) into out. Zones are refused.
func parseIPv6(b []byte, out *[16]byte) bool {
	if len(b) < 2 || len(b) > 45 {
		return false
	}
	ellipsis := -1 // index in out where "::" stands
	i := 0
	if b[0] == ':' {
		if b[1] != ':' {
			return false
		}
		ellipsis = 0
		i = 2
		if i == len(b) {
			*out = [16]byte{}
			return true
		}
	}
	n := 0 // bytes of out written
	for i < len(b) {
		// A group: hex digits, or an IPv4 tail.
		j, v := i, 0
		for j < len(b) && j-i < 5 {
			c := b[j]
			var d int
			switch {
			case c >= '0' && c <= '9':
				d = int(c - '0')
			case c >= 'a' && c <= 'f':
				d = int(c-'a') + 10
			case c >= 'A' && c <= 'F':
				d = int(c-'A') + 10
			default:
				d = -1
			}
			if d < 0 {
				break
			}
			v = v<<4 | d
			j++
		}
		if j < len(b) && b[j] == '.' {
			// IPv4 tail: the last 4 bytes.
			if n > 12 || !parseIPv4(b[i:], out[n:n+4]) {
				return false
			}
			n += 4
			break
		}
		if j == i || j-i > 4 {
			return false
		}
		if n+2 > 16 {
			return false
		}
		out[n], out[n+1] = byte(v>>8), byte(v)
		n += 2
		i = j
		if i == len(b) {
			break
		}
		if b[i] != ':' {
			return false
		}
		i++
		if i < len(b) && b[i] == ':' {
			if ellipsis >= 0 {
				return false
			}
			ellipsis = n
			i++
			if i == len(b) {
				break
			}
		} else if i == len(b) {
			return false // a trailing single ':'
		}
	}
	if ellipsis < 0 {
		return n == 16
	}
	if n == 16 {
		return false // "::" must stand for at least one group
	}
	gap := 16 - n
	copy(out[ellipsis+gap:], out[ellipsis:n])
	clear(out[ellipsis : ellipsis+gap])
	return true
}

func parseV2(b []byte) (Header, int, error) {
	n := min(len(b), len(v2Sig))
	if string(b[:n]) != string(v2Sig[:n]) {
		return Header{}, 0, ErrMissing
	}
	if len(b) < V2HeaderLen {
		return Header{}, 0, ErrIncomplete
	}
	if b[12]>>4 != 2 {
		return Header{}, 0, ErrV2Version
	}
	cmd := Command(b[12] & 0xf)
	if cmd > Proxy {
		return Header{}, 0, ErrV2Command
	}
	fam, proto := b[13]>>4, b[13]&0xf
	if fam > 3 || proto > 2 {
		return Header{}, 0, ErrV2Family
	}
	l := int(binary.BigEndian.Uint16(b[14:16]))
	if l > MaxV2Payload {
		return Header{}, 0, ErrV2TooLong
	}
	var need int
	switch fam {
	case 1:
		need = 12
	case 2:
		need = 36
	case 3:
		need = 216
	}
	if cmd == Proxy && l < need {
		return Header{}, 0, ErrV2Short
	}
	total := V2HeaderLen + l
	if len(b) < total {
		return Header{}, 0, ErrIncomplete
	}
	h := Header{Version: 2, Command: cmd}
	if cmd == Local || proto == 0 {
		// LOCAL: the balancer's own connection. UNSPEC transport: the
		// receiver must use the connection's addresses.
		return h, total, nil
	}
	a := b[V2HeaderLen:total]
	switch fam {
	case 1:
		src := netip.AddrFrom4([4]byte(a[0:4]))
		dst := netip.AddrFrom4([4]byte(a[4:8]))
		h.Source = netip.AddrPortFrom(src, binary.BigEndian.Uint16(a[8:10]))
		h.Dest = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(a[10:12]))
	case 2:
		src := netip.AddrFrom16([16]byte(a[0:16]))
		dst := netip.AddrFrom16([16]byte(a[16:32]))
		h.Source = netip.AddrPortFrom(src, binary.BigEndian.Uint16(a[32:34]))
		h.Dest = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(a[34:36]))
	}
	return h, total, nil
}

// AppendV1 appends a v1 header naming src connected to dst: TCP4 when
// both are IPv4 (or IPv4-mapped), TCP6 otherwise, UNKNOWN when either is
// invalid.
func AppendV1(b []byte, src, dst netip.AddrPort) []byte {
	if !src.IsValid() || !dst.IsValid() {
		return append(b, "PROXY UNKNOWN\r\n"...)
	}
	s, d := src.Addr().Unmap(), dst.Addr().Unmap()
	if s.Is4() && d.Is4() {
		b = append(b, "PROXY TCP4 "...)
	} else {
		s, d = as16(s), as16(d)
		b = append(b, "PROXY TCP6 "...)
	}
	b = s.AppendTo(b)
	b = append(b, ' ')
	b = d.AppendTo(b)
	b = append(b, ' ')
	b = appendUint(b, src.Port())
	b = append(b, ' ')
	b = appendUint(b, dst.Port())
	return append(b, '\r', '\n')
}

// as16 returns a as an IPv6 address (IPv4 mapped), without a zone.
func as16(a netip.Addr) netip.Addr {
	return netip.AddrFrom16(a.As16())
}

func appendUint(b []byte, v uint16) []byte {
	var t [5]byte
	i := len(t)
	for {
		i--
		t[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			break
		}
	}
	return append(b, t[i:]...)
}

// AppendV2 appends a v2 PROXY header over TCP naming src connected to
// dst (AF_INET when both are IPv4 or IPv4-mapped, AF_INET6 otherwise), or
// a LOCAL header when either is invalid. It writes no TLV.
func AppendV2(b []byte, src, dst netip.AddrPort) []byte {
	b = append(b, v2Sig[:]...)
	if !src.IsValid() || !dst.IsValid() {
		return append(b, 0x20, 0x00, 0, 0)
	}
	s, d := src.Addr().Unmap(), dst.Addr().Unmap()
	if s.Is4() && d.Is4() {
		b = append(b, 0x21, 0x11, 0, 12)
		s4, d4 := s.As4(), d.As4()
		b = append(b, s4[:]...)
		b = append(b, d4[:]...)
	} else {
		b = append(b, 0x21, 0x21, 0, 36)
		s16, d16 := s.As16(), d.As16()
		b = append(b, s16[:]...)
		b = append(b, d16[:]...)
	}
	b = binary.BigEndian.AppendUint16(b, src.Port())
	return binary.BigEndian.AppendUint16(b, dst.Port())
}

// Append appends a header of version v (1 or 2; anything else is 2).
func Append(b []byte, v uint8, src, dst netip.AddrPort) []byte {
	if v == 1 {
		return AppendV1(b, src, dst)
	}
	return AppendV2(b, src, dst)
}
