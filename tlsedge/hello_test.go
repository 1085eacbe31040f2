package tlsedge

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// chunkConn is a net.Conn whose reads return the chunks in order (each
// cut to the reader's buffer), then err (io.EOF when nil). It records
// the largest buffer a read was given.
type chunkConn struct {
	net.Conn
	chunks  [][]byte
	err     error
	maxRead int
	read    int
}

func (c *chunkConn) Read(p []byte) (int, error) {
	c.maxRead = max(c.maxRead, len(p))
	for len(c.chunks) > 0 && len(c.chunks[0]) == 0 {
		c.chunks = c.chunks[1:]
	}
	if len(c.chunks) == 0 {
		if c.err != nil {
			return 0, c.err
		}
		return 0, io.EOF
	}
	n := copy(p, c.chunks[0])
	c.chunks[0] = c.chunks[0][n:]
	c.read += n
	return n, nil
}

// clientHello returns the first flight of a crypto/tls client: one
// record holding its ClientHello.
func clientHello(t testing.TB) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go tls.Client(a, &tls.Config{ServerName: "a.example", InsecureSkipVerify: true}).Handshake()
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(b, hdr); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(b, body); err != nil {
		t.Fatal(err)
	}
	return append(hdr, body...)
}

// record returns a TLS record of type typ around body.
func record(typ byte, body []byte) []byte {
	return append([]byte{typ, 3, 1, byte(len(body) >> 8), byte(len(body))}, body...)
}

// fragment cuts the body of the one-record hello h into records of at
// most size bytes each.
func fragment(h []byte, size int) []byte {
	var out []byte
	for body := h[5:]; len(body) > 0; {
		k := min(size, len(body))
		out = append(out, record(22, body[:k])...)
		body = body[k:]
	}
	return out
}

// TestReadHello: the golden cases, the whole input given in one read.
func TestReadHello(t *testing.T) {
	h := clientHello(t)
	after := []byte("early bytes the hello's reader must leave to crypto/tls")
	big := record(22, append([]byte{1, 0, 0x40, 0}, make([]byte, 1<<14)...)) // a 16 KiB + 4 message in one record: 16388 bytes
	msg := append([]byte{1, 0, 0x60, 0}, make([]byte, 0x6000)...)            // 24 KiB: two records
	twoRecords := append(record(22, msg[:1<<14]), record(22, msg[1<<14:])...)
	for _, tc := range []struct {
		name string
		in   []byte
		want []byte // what ReadHello returns
		err  error
	}{
		{"hello", h, h, nil},
		{"hello then more", append(append([]byte{}, h...), after...), h, nil},
		{"4 of a hello's 1-byte records", fragment(h, 1)[:6*4], fragment(h, 1)[:6*4], io.ErrUnexpectedEOF},
		{"hello in 100-byte records", fragment(h, 100), fragment(h, 100), nil},
		{"largest record", big, big, nil},
		{"message over two records", twoRecords, twoRecords, nil},
		{"plain HTTP", []byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n"), []byte("GET /"), ErrNotHello},
		{"PROXY v1", []byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n"), []byte("PROXY"), ErrNotHello},
		{"alert record", record(21, []byte{2, 40}), record(21, []byte{2, 40})[:5], ErrNotHello},
		{"empty handshake record", record(22, nil), record(22, nil), ErrNotHello},
		{"oversized record", []byte{22, 3, 1, 0x41, 0x01, 1}, []byte{22, 3, 1, 0x41, 0x01}, ErrNotHello},
		{"largest record length + 1 announced", []byte{22, 3, 1, 0x41, 0x01}, []byte{22, 3, 1, 0x41, 0x01}, ErrNotHello},
		{"not a ClientHello", record(22, []byte{2, 0, 0, 1, 0}), record(22, []byte{2, 0, 0, 1, 0}), ErrNotHello},
		{"ClientHello over MaxHello", record(22, []byte{1, 1, 0, 0, 0}), record(22, []byte{1, 1, 0, 0, 0}), ErrNotHello},
		{"ClientHello at MaxHello announced", record(22, []byte{1, 0, 0xff, 0xfc}), record(22, []byte{1, 0, 0xff, 0xfc}), io.ErrUnexpectedEOF},
		{"second record not handshake", append(record(22, []byte{1, 0, 0, 4}), record(23, []byte{0, 0, 0, 0})...), append(record(22, []byte{1, 0, 0, 4}), 23, 3, 1, 0, 4), ErrNotHello},
		{"too many records", fragment(append([]byte{22, 3, 1, 0, 20, 1, 0, 0, 16}, make([]byte, 16)...), 1), fragment(append([]byte{22, 3, 1, 0, 20, 1, 0, 0, 16}, make([]byte, 16)...), 1)[:6*16], ErrNotHello},
		{"nothing", nil, nil, io.EOF},
		{"half a header", h[:3], h[:3], io.ErrUnexpectedEOF},
		{"header only", h[:5], h[:5], io.ErrUnexpectedEOF},
		{"half the body", h[:len(h)/2], h[:len(h)/2], io.ErrUnexpectedEOF},
		{"all but the last byte", h[:len(h)-1], h[:len(h)-1], io.ErrUnexpectedEOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &chunkConn{chunks: [][]byte{append([]byte{}, tc.in...)}}
			got, err := ReadHello(c, nil)
			if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if !bytes.Equal(got, tc.want) {
				t.Fatalf("returned %d bytes %q, want %d %q", len(got), got[:min(len(got), 16)], len(tc.want), tc.want[:min(len(tc.want), 16)])
			}
			if c.read != len(got) {
				t.Fatalf("read %d bytes, returned %d: it read past what it returns", c.read, len(got))
			}
		})
	}
}

// TestReadHelloSplit: a hello cut in two at every byte, as two reads,
// reads the same; so does a hello of 100-byte records.
func TestReadHelloSplit(t *testing.T) {
	for _, h := range [][]byte{clientHello(t), fragment(clientHello(t), 100)} {
		for i := 0; i <= len(h); i++ {
			c := &chunkConn{chunks: [][]byte{append([]byte{}, h[:i]...), append([]byte{}, h[i:]...)}}
			got, err := ReadHello(c, nil)
			if err != nil || !bytes.Equal(got, h) {
				t.Fatalf("split at %d: %d bytes, %v", i, len(got), err)
			}
		}
	}
}

// TestReadHelloByteAtATime: a hello trickled a byte a read is read whole,
// and so is one of 1-byte records up to MaxHelloRecords.
func TestReadHelloByteAtATime(t *testing.T) {
	h := clientHello(t)
	short := record(22, []byte{1, 0, 0, 10, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0})
	for _, in := range [][]byte{h, fragment(short, 1)} {
		var chunks [][]byte
		for _, b := range in {
			chunks = append(chunks, []byte{b})
		}
		got, err := ReadHello(&chunkConn{chunks: chunks}, nil)
		if err != nil || !bytes.Equal(got, in) {
			t.Fatalf("%d bytes, %v; want %d", len(got), err, len(in))
		}
	}
}

// TestReadHelloAppends: the bytes are appended to buf.
func TestReadHelloAppends(t *testing.T) {
	h := clientHello(t)
	got, err := ReadHello(&chunkConn{chunks: [][]byte{h}}, []byte("x"))
	if err != nil || !bytes.Equal(got, append([]byte("x"), h...)) {
		t.Fatalf("%q, %v", got[:min(len(got), 8)], err)
	}
}

// TestReadHelloGrowsWithArrivals: a client that announces the largest
// record and sends 10 bytes of it makes ReadHello hold 512 bytes, not
// 16 KiB.
func TestReadHelloGrowsWithArrivals(t *testing.T) {
	in := append([]byte{22, 3, 1, 0x41, 0x00}, make([]byte, 10)...)
	c := &chunkConn{chunks: [][]byte{in}, err: os.ErrDeadlineExceeded}
	got, err := ReadHello(c, nil)
	if !errors.Is(err, os.ErrDeadlineExceeded) || !bytes.Equal(got, in) {
		t.Fatalf("%d bytes, %v", len(got), err)
	}
	if cap(got) > 512 || c.maxRead > 512 {
		t.Fatalf("capacity %d, largest read %d for %d bytes received: want at most 512", cap(got), c.maxRead, len(in))
	}
	allocs := testing.AllocsPerRun(20, func() {
		ReadHello(&chunkConn{chunks: [][]byte{append([]byte{}, in...)}, err: os.ErrDeadlineExceeded}, nil)
	})
	if allocs > 4 { // the conn, its list of chunks, the chunk, one buffer
		t.Fatalf("%.0f allocations", allocs)
	}
}

// TestReadHelloDeadline: a deadline already past ends the read with the
// socket's error and what arrived before it.
func TestReadHelloDeadline(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	h := clientHello(t)
	go a.Write(h[:7])
	// Wait for the 7 bytes to be read, then the deadline passes.
	c := &deadlineAfter{Conn: b, after: 7}
	got, err := ReadHello(c, nil)
	if !errors.Is(err, os.ErrDeadlineExceeded) || !bytes.Equal(got, h[:7]) {
		t.Fatalf("%d bytes, %v", len(got), err)
	}
}

// deadlineAfter sets its deadline in the past once after bytes were read.
type deadlineAfter struct {
	net.Conn
	after, n int
}

func (d *deadlineAfter) Read(p []byte) (int, error) {
	if d.n >= d.after {
		d.Conn.SetReadDeadline(time.Unix(1, 0))
	}
	n, err := d.Conn.Read(p)
	d.n += n
	return n, err
}

// TestReadHelloGivesCryptoTLSTheSameBytes: crypto/tls, given the bytes
// ReadHello read ahead of the socket, completes the handshake.
func TestReadHelloGivesCryptoTLSTheSameBytes(t *testing.T) {
	k := testKey(t, "ecdsa", 0)
	cert := tls.Certificate{Certificate: [][]byte{makeCert(t, certOpts{dns: []string{"a.example"}, key: k})}, PrivateKey: k}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	errc := make(chan error, 1)
	go func() {
		errc <- tls.Client(a, &tls.Config{ServerName: "a.example", InsecureSkipVerify: true}).Handshake()
	}()
	h, err := ReadHello(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := tls.Server(&prefixConn{Conn: b, pre: h}, &tls.Config{Certificates: []tls.Certificate{cert}})
	if err := s.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// prefixConn reads pre, then Conn.
type prefixConn struct {
	net.Conn
	pre []byte
}

func (p *prefixConn) Read(b []byte) (int, error) {
	if len(p.pre) > 0 {
		n := copy(b, p.pre)
		p.pre = p.pre[n:]
		return n, nil
	}
	return p.Conn.Read(b)
}

// FuzzReadHello: any bytes, in any cut, are read without a panic, never
// past what is returned, never beyond the bounds; what is returned is
// the start of the input; and the same bytes in one read give the same.
func FuzzReadHello(f *testing.F) {
	h := clientHello(f)
	f.Add(h, uint16(3))
	f.Add(fragment(h, 7), uint16(100))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"), uint16(1))
	f.Add([]byte{22, 3, 1, 0, 4, 1, 0, 0, 0}, uint16(2))
	f.Fuzz(func(t *testing.T, in []byte, cut uint16) {
		var chunks [][]byte
		for rest := in; len(rest) > 0; {
			k := min(len(rest), int(cut%64)+1)
			chunks = append(chunks, append([]byte{}, rest[:k]...))
			rest = rest[k:]
		}
		c := &chunkConn{chunks: chunks}
		got, err := ReadHello(c, nil)
		if !bytes.HasPrefix(in, got) || c.read != len(got) {
			t.Fatalf("returned %d bytes, read %d, of %d", len(got), c.read, len(in))
		}
		if len(got) > MaxHelloRecords*recordHeader+MaxHello+MaxHelloRecord {
			t.Fatalf("%d bytes", len(got))
		}
		if cap(got) > max(512, 2*len(got)) {
			t.Fatalf("capacity %d for %d bytes", cap(got), len(got))
		}
		one, err1 := ReadHello(&chunkConn{chunks: [][]byte{append([]byte{}, in...)}}, nil)
		if !bytes.Equal(one, got) || !errors.Is(err1, err) && !errors.Is(err, err1) {
			t.Fatalf("in one read: %d bytes, %v; cut: %d, %v", len(one), err1, len(got), err)
		}
	})
}
