package http

import (
	"bytes"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"testing"
)

// adapterPair is a TLS server and client, each over a recordConn, with
// the handshake done over a loopback socket and both then in memory mode:
// what one writes is taken from its recordConn and fed to the other's.
type adapterPair struct {
	srv, cli     *tls.Conn
	srvRC, cliRC *recordConn
}

func newAdapterPair(t testing.TB, version uint16) *adapterPair {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := testTLS(t).server()
	cfg.MinVersion, cfg.MaxVersion = version, version
	cfg.SessionTicketsDisabled = true // nothing after the handshake but what the test writes
	var p adapterPair
	var serr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := ln.Accept()
		if err != nil {
			serr = err
			return
		}
		p.srvRC = newRecordConn(c)
		p.srv = tls.Server(p.srvRC, cfg)
		serr = p.srv.Handshake()
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	p.cliRC = newRecordConn(c)
	p.cli = tls.Client(p.cliRC, testTLS(t).client("a.example"))
	cerr := p.cli.Handshake()
	wg.Wait()
	if cerr != nil || serr != nil {
		t.Fatalf("handshake: client %v, server %v", cerr, serr)
	}
	for _, rc := range []*recordConn{p.srvRC, p.cliRC} {
		sock := rc.conn
		rc.memory()
		sock.Close()
	}
	return &p
}

// deliver feeds ct to the reader's recordConn in pieces (cut gives the
// length of each, at least 1) and reads plaintext after every piece until
// it would block, rbuf bytes at a time; it returns the plaintext.
func deliver(t testing.TB, to *tls.Conn, rc *recordConn, ct []byte, cut func(i int) int, rbuf int) []byte {
	t.Helper()
	var got []byte
	buf := make([]byte, rbuf)
	for i := 0; len(ct) > 0; i++ {
		n := min(max(cut(i), 1), len(ct))
		rc.feed(ct[:n])
		ct = ct[n:]
		for {
			m, err := to.Read(buf)
			got = append(got, buf[:m]...)
			if err != nil {
				var wb wouldBlock
				if !errors.As(err, &wb) {
					t.Fatalf("read after %d pieces: %v", i+1, err)
				}
				if rc.buffered() != 0 {
					t.Fatalf("would block with %d bytes buffered", rc.buffered())
				}
				break
			}
		}
	}
	return got
}

// TestRecordConnSplitEveryByte: records fed one byte at a time, in both
// directions, TLS 1.2 and 1.3, read into a small buffer (partial
// plaintext of a record) and a large one: the plaintext is what was sent,
// and tls.Conn goes on after each would-block.
func TestRecordConnSplitEveryByte(t *testing.T) {
	one := func(int) int { return 1 }
	for _, v := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		p := newAdapterPair(t, v)
		for _, msg := range [][]byte{[]byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n"), bytes.Repeat([]byte("0123456789"), 4000)} {
			for _, rbuf := range []int{7, 64 << 10} {
				if _, err := p.cli.Write(msg); err != nil {
					t.Fatal(err)
				}
				ct := bytes.Clone(p.cliRC.take())
				if got := deliver(t, p.srv, p.srvRC, ct, one, rbuf); !bytes.Equal(got, msg) {
					t.Fatalf("TLS %x, %d bytes, read buffer %d: client to server gave %d bytes, want them as sent", v, len(msg), rbuf, len(got))
				}
				if _, err := p.srv.Write(msg); err != nil {
					t.Fatal(err)
				}
				ct = bytes.Clone(p.srvRC.take())
				if got := deliver(t, p.cli, p.cliRC, ct, one, rbuf); !bytes.Equal(got, msg) {
					t.Fatalf("TLS %x, %d bytes, read buffer %d: server to client gave %d bytes, want them as sent", v, len(msg), rbuf, len(got))
				}
			}
		}
	}
}

// TestRecordConnCorruptRecord: a record changed on the way is an error,
// not a would-block, the server writes an alert, and the connection stays
// broken.
func TestRecordConnCorruptRecord(t *testing.T) {
	p := newAdapterPair(t, tls.VersionTLS13)
	p.cli.Write([]byte("hello"))
	ct := bytes.Clone(p.cliRC.take())
	ct[len(ct)-1] ^= 1
	p.srvRC.feed(ct)
	buf := make([]byte, 64)
	_, err := p.srv.Read(buf)
	var wb wouldBlock
	if err == nil || errors.As(err, &wb) {
		t.Fatalf("corrupt record: %v, want a TLS error", err)
	}
	if len(p.srvRC.take()) == 0 {
		t.Errorf("no alert written")
	}
	p.cli.Write([]byte("again"))
	p.srvRC.feed(p.cliRC.take())
	if _, err2 := p.srv.Read(buf); err2 == nil || errors.As(err2, &wb) {
		t.Errorf("after a corrupt record: %v, want the connection broken", err2)
	}
}

// TestRecordConnBlockingMode: back in blocking mode (a hand-over), the
// bytes still in memory are read first and what is kept is written
// before new bytes.
func TestRecordConnBlockingMode(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	rc := &recordConn{}
	rc.feed([]byte("kept"))
	rc.Write([]byte("out1 "))
	rc.block(a)
	go func() {
		b.Write([]byte("sock"))
		buf := make([]byte, 64)
		n, _ := b.Read(buf)
		m, _ := b.Read(buf[n:])
		b.Write(buf[:n+m])
	}()
	buf := make([]byte, 64)
	n, _ := rc.Read(buf)
	m, _ := rc.Read(buf[n:])
	if string(buf[:n+m]) != "keptsock" {
		t.Errorf("read %q, want the buffered bytes, then the socket's", buf[:n+m])
	}
	rc.Write([]byte("out2"))
	n, _ = rc.Read(buf)
	if string(buf[:n]) != "out1 out2" {
		t.Errorf("the peer got %q, want out1 then out2", buf[:n])
	}
}

var (
	fuzzPairOnce sync.Once
	fuzzPair     *adapterPair
)

// FuzzRecordAdapter: a message written by the client, its records split
// at the points the fuzzer chooses (each byte of cuts is the length of a
// piece) and read into a buffer of the size it chooses, gives the server
// exactly the message. The pair lives for the whole run: every message
// is read in full, so the next one starts at a record boundary.
func FuzzRecordAdapter(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n"), []byte{1}, uint16(1))
	f.Add(bytes.Repeat([]byte("x"), 20000), []byte{5, 200, 1, 3}, uint16(16))
	f.Add([]byte("a"), []byte{0, 0, 255}, uint16(65535))
	f.Fuzz(func(t *testing.T, msg, cuts []byte, rbuf uint16) {
		if len(msg) == 0 || len(msg) > 40000 { // up to three records: enough for every boundary, quick to run
			return
		}
		fuzzPairOnce.Do(func() { fuzzPair = newAdapterPair(t, tls.VersionTLS13) })
		p := fuzzPair
		if _, err := p.cli.Write(msg); err != nil {
			t.Fatal(err)
		}
		ct := bytes.Clone(p.cliRC.take())
		cut := func(i int) int {
			if len(cuts) == 0 {
				return len(ct)
			}
			return int(cuts[i%len(cuts)])
		}
		if got := deliver(t, p.srv, p.srvRC, ct, cut, max(int(rbuf), 1)); !bytes.Equal(got, msg) {
			t.Fatalf("got %d bytes, want the %d sent", len(got), len(msg))
		}
	})
}

// TestRecordConnTrack: the record framing recordConn follows over the
// bytes it gives, whatever the pieces they come in (golden vectors: whole
// records, a header split, a record split in its body, a zero-length
// record, two records at once).
func TestRecordConnTrack(t *testing.T) {
	rec := func(n int) []byte { // a record header of body length n, and the body
		b := []byte{23, 3, 3, byte(n >> 8), byte(n)}
		return append(b, bytes.Repeat([]byte{'x'}, n)...)
	}
	for _, tc := range []struct {
		name    string
		pieces  [][]byte
		ends    int
		settled bool
	}{
		{"one record", [][]byte{rec(30)}, 1, true},
		{"header split", [][]byte{rec(30)[:2], rec(30)[2:]}, 1, true},
		{"body split", [][]byte{rec(300)[:100], rec(300)[100:]}, 1, true},
		{"header only", [][]byte{rec(30)[:5]}, 0, false},
		{"part of the header", [][]byte{rec(30)[:3]}, 0, false},
		{"zero-length record", [][]byte{rec(0)}, 1, true},
		{"two records at once", [][]byte{append(rec(10), rec(20)...)}, 2, false},
		{"a record and part of the next", [][]byte{append(rec(10), rec(20)[:7]...)}, 1, false},
		{"long record", [][]byte{rec(16<<10 + 256)}, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &recordConn{}
			for _, p := range tc.pieces {
				a.feed(p)
			}
			buf := make([]byte, 7) // pieces of the read crossing every boundary
			for a.buffered() > 0 {
				if _, err := a.Read(buf); err != nil {
					t.Fatal(err)
				}
			}
			if a.ends != tc.ends || a.settled() != tc.settled {
				t.Errorf("ends %d settled %v, want %d and %v", a.ends, a.settled(), tc.ends, tc.settled)
			}
			a.resetEnds()
			if a.settled() {
				t.Errorf("settled after resetEnds")
			}
		})
	}
}
