package accesslog

// W3C Trace Context (https://www.w3.org/TR/trace-context/): the
// traceparent header is "VERSION-TRACEID-PARENTID-FLAGS" in lower-case hex,
// 2-32-16-2 digits. sluice reads it to log the trace and parent span and
// passes the header on unchanged.

// TraceparentLen is the length of a version 00 traceparent.
const TraceparentLen = 55

// ParseTraceparent reads a traceparent header value. It follows the
// specification's rules for a receiver: version ff is invalid; a version
// above 00 may carry more fields after a '-' (its first 55 bytes are read
// as version 00); the trace id and the parent id may not be all zeros;
// hex must be lower case. ok is false for anything else, and the ids are
// then zero.
func ParseTraceparent(s string) (tid [16]byte, pid [8]byte, flags byte, ok bool) {
	return parseTraceparent(s)
}

// ParseTraceparentBytes is ParseTraceparent for a header's bytes; it does
// not allocate.
func ParseTraceparentBytes(b []byte) (tid [16]byte, pid [8]byte, flags byte, ok bool) {
	return parseTraceparent(b)
}

func parseTraceparent[T ~string | ~[]byte](s T) (tid [16]byte, pid [8]byte, flags byte, ok bool) {
	if len(s) < TraceparentLen {
		return
	}
	ver, vok := hexByte(s[0], s[1])
	if !vok || ver == 0xff || s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return
	}
	if len(s) > TraceparentLen && (ver == 0 || s[TraceparentLen] != '-') {
		return
	}
	var nz byte
	for i := range tid {
		b, k := hexByte(s[3+2*i], s[4+2*i])
		if !k {
			return [16]byte{}, [8]byte{}, 0, false
		}
		tid[i] = b
		nz |= b
	}
	if nz == 0 {
		return [16]byte{}, [8]byte{}, 0, false
	}
	nz = 0
	for i := range pid {
		b, k := hexByte(s[36+2*i], s[37+2*i])
		if !k {
			return [16]byte{}, [8]byte{}, 0, false
		}
		pid[i] = b
		nz |= b
	}
	if nz == 0 {
		return [16]byte{}, [8]byte{}, 0, false
	}
	f, k := hexByte(s[53], s[54])
	if !k {
		return [16]byte{}, [8]byte{}, 0, false
	}
	return tid, pid, f, true
}

func hexNibble(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

func hexByte(hi, lo byte) (byte, bool) {
	h, ok1 := hexNibble(hi)
	l, ok2 := hexNibble(lo)
	return h<<4 | l, ok1 && ok2
}

const hexDigits = "0123456789abcdef"

// AppendHex appends b in lower-case hex.
func AppendHex(dst []byte, b []byte) []byte {
	for _, c := range b {
		dst = append(dst, hexDigits[c>>4], hexDigits[c&15])
	}
	return dst
}

// AppendTraceparent appends a version 00 traceparent for the ids and flags.
func AppendTraceparent(dst []byte, tid [16]byte, pid [8]byte, flags byte) []byte {
	dst = append(dst, "00-"...)
	dst = AppendHex(dst, tid[:])
	dst = append(dst, '-')
	dst = AppendHex(dst, pid[:])
	dst = append(dst, '-', hexDigits[flags>>4], hexDigits[flags&15])
	return dst
}

// FormatTraceparent returns AppendTraceparent as a string.
func FormatTraceparent(tid [16]byte, pid [8]byte, flags byte) string {
	var b [TraceparentLen]byte
	return string(AppendTraceparent(b[:0], tid, pid, flags))
}
