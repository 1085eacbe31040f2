package proxyproto

import (
	"errors"
	"io"
	"net"
)

// errTruncated: the connection ended within a header.
var errTruncated = &Error{"connection ended within the header"}

// ErrTruncated is what Read returns when the connection ends (EOF) within
// a header; Reason calls it ReasonTruncated.
var ErrTruncated = errTruncated

// Read reads one header from r, never a byte past it, so r's next bytes
// are the connection's own (a TLS handshake, a request) and r needs no
// wrapper. buf is scratch space of at least MaxLen bytes (a shorter one is
// replaced). A v2 header takes two reads (its fixed part, then the rest);
// a v1 header, whose length is known only at its CRLF, takes reads of
// the least it may still need (v1More), a few per header.
//
// The caller sets the deadline (-proxy-protocol-timeout) on the
// connection; an error is from Parse, ErrTruncated at EOF, or r's.
func Read(r io.Reader, buf []byte) (Header, error) {
	if len(buf) < MaxLen {
		buf = make([]byte, MaxLen)
	}
	n, err := io.ReadFull(r, buf[:MinV1Len])
	if err != nil {
		return Header{}, readErr(err, buf[:n])
	}
	for {
		h, hl, err := Parse(buf[:n])
		if err == nil {
			return h, nil
		}
		if err != ErrIncomplete {
			return Header{}, err
		}
		_ = hl
		want := n + v1More(buf[:n])
		if buf[0] == '\r' {
			// v2: the fixed part, then exactly the length it gives.
			want = V2HeaderLen
			if n >= V2HeaderLen {
				want = V2HeaderLen + (int(buf[14])<<8 | int(buf[15]))
			}
		}
		if want <= n || want > len(buf) {
			return Header{}, ErrV2TooLong // cannot happen: Parse bounds the length
		}
		m, err := io.ReadFull(r, buf[n:want])
		n += m
		if err != nil {
			return Header{}, readErr(err, buf[:n])
		}
	}
}

// readErr turns a read error into Read's: a header cut by EOF is
// ErrTruncated, unless what came cannot start a header at all.
func readErr(err error, got []byte) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		if _, _, perr := Parse(got); perr != ErrIncomplete && perr != nil {
			return perr
		}
		return ErrTruncated
	}
	return err
}

// isTimeout reports whether err is a deadline that passed.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// v1More is the fewest bytes the v1 line b (at least MinV1Len bytes, no
// LF yet) still needs: CRLF, and for TCP4/TCP6 a space and at least one
// character for each of the 5 fields' separators not yet seen. Reading
// no more than that never reads past the header.
func v1More(b []byte) int {
	if b[len(b)-1] == '\r' {
		return 1
	}
	if string(b[len(v1Sig):len(v1Sig)+4]) != "TCP4" && string(b[len(v1Sig):len(v1Sig)+4]) != "TCP6" {
		return 1 // UNKNOWN: anything up to CRLF
	}
	spaces := 0
	for _, c := range b {
		if c == ' ' {
			spaces++
		}
	}
	more := 2 // CRLF
	if spaces < 5 {
		more += 2 * (5 - spaces)
	}
	if b[len(b)-1] == ' ' {
		more++ // the field just begun has no character yet
	}
	return more
}
