package tlsedge

import (
	"errors"
	"io"
	"net"
)

// A connection takes a place of the HandshakeLimiter only once its
// ClientHello has arrived whole. Until then it has cost nothing but a
// socket, which the front ends' connection limits (global and per source)
// and the handshake timeout already bound; were the place taken at accept,
// a few addresses trickling a ClientHello a byte a second would hold every
// place of the node for the timeout, and refuse every other client's
// handshake for as long as they repeat it, each staying within its
// source's share. The front ends read the hello with ReadHello, take the
// place, then give the bytes read to crypto/tls ahead of the socket.

// Bounds of what ReadHello waits for: beyond them it is not a ClientHello
// any TLS client sends (ErrNotHello), and crypto/tls may say why.
const (
	// MaxHelloRecord is the longest record body ReadHello waits for:
	// 2^14 bytes of plaintext and the 256 of expansion RFC 8446 §5.2
	// allows a record.
	MaxHelloRecord = 1<<14 + 256
	// MaxHello is the longest ClientHello message (its 4-byte header
	// included) ReadHello waits for, crypto/tls's own bound on a
	// handshake message.
	MaxHello = 1 << 16
	// MaxHelloRecords is how many records the ClientHello may span:
	// without a bound, a hello cut into 1-byte records would cost five
	// bytes of headers for each of its own.
	MaxHelloRecords = 16
)

// The TLS record and handshake types and lengths ReadHello reads.
const (
	recordTypeHandshake  = 22
	handshakeClientHello = 1
	recordHeader         = 5
	handshakeHeader      = 4
)

// ErrNotHello is ReadHello's error for bytes that cannot be a TLS client's
// first flight: a record other than a handshake record, an empty record or
// one longer than MaxHelloRecord, a first handshake message other than a
// ClientHello or longer than MaxHello, more than MaxHelloRecords records.
// The bytes read so far are returned with it: the caller gives them to
// crypto/tls, which fails on them as it does on the socket (plain HTTP to
// an HTTPS port, a PROXY header from a source not allowed to send one).
var ErrNotHello = errors.New("tls: first bytes are not a ClientHello's records")

// ReadHello reads from c the records of a TLS client's ClientHello: from
// the first byte of the connection up to the record in which the
// ClientHello message ends, exactly (no byte after it is read). It appends
// them to buf and returns the result, with a nil error when the whole
// ClientHello arrived; else with ErrNotHello (see there), with
// io.ErrUnexpectedEOF when the connection ended within it (io.EOF when it
// sent nothing), or with c's read error (its deadline: the handshake
// timeout). It reads nothing but the records' framing and the message's
// type and length, which crypto/tls checks again.
//
// Memory grows with the bytes that arrive, not with the lengths they
// announce: a client that announces a 16 KiB record and sends 10 bytes of
// it costs at most 512 bytes beyond buf, and the buffer never holds more
// than twice what arrived (or 512 bytes).
func ReadHello(c net.Conn, buf []byte) ([]byte, error) {
	b := buf
	start := len(buf)
	off := start // where the record to read starts
	var hdr [handshakeHeader]byte
	hn := 0   // bytes of the handshake message's header in hdr
	msg := -1 // the message's length, header included, once known
	got := 0  // bytes of the message read
	for records := 0; ; records++ {
		if records == MaxHelloRecords {
			return b, ErrNotHello
		}
		var err error
		if b, err = readTo(c, b, off+recordHeader, start); err != nil {
			return b, err
		}
		n := int(b[off+3])<<8 | int(b[off+4])
		if b[off] != recordTypeHandshake || n == 0 || n > MaxHelloRecord {
			return b, ErrNotHello
		}
		body := off + recordHeader
		if b, err = readTo(c, b, body+n, start); err != nil {
			return b, err
		}
		p := b[body : body+n]
		off = body + n
		if hn < handshakeHeader {
			k := copy(hdr[hn:], p)
			hn += k
			if hn == handshakeHeader {
				msg = handshakeHeader + (int(hdr[1])<<16 | int(hdr[2])<<8 | int(hdr[3]))
				if hdr[0] != handshakeClientHello || msg > MaxHello {
					return b, ErrNotHello
				}
			}
		}
		got += n
		if msg >= 0 && got >= msg {
			return b, nil
		}
	}
}

// readTo reads from c into b until len(b) is want, growing b with what
// arrives (doubling, from 512 bytes), never reading beyond want. start is
// where the connection's bytes begin in b: an EOF after it is
// io.ErrUnexpectedEOF.
func readTo(c net.Conn, b []byte, want, start int) ([]byte, error) {
	for len(b) < want {
		if len(b) == cap(b) {
			nb := make([]byte, len(b), max(2*cap(b), 512))
			copy(nb, b)
			b = nb
		}
		n, err := c.Read(b[len(b):min(cap(b), want)])
		b = b[:len(b)+max(n, 0)]
		if err != nil && len(b) < want {
			if err == io.EOF && len(b) > start {
				err = io.ErrUnexpectedEOF
			}
			return b, err
		}
	}
	return b, nil
}
