package sip

import (
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"
)

// tlsPair is a TLS client and server session over an in-memory pipe,
// their handshake done.
func tlsPair(t *testing.T) (cli, srv *tls.Conn) {
	t.Helper()
	sc, cc := testTLS(t)
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	cli, srv = tls.Client(a, cc), tls.Server(b, sc)
	errs := make(chan error, 1)
	go func() { errs <- srv.Handshake() }()
	if err := cli.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	return cli, srv
}

// exchange sends p from w to r (in as many records as its size takes)
// and checks it arrives whole.
func exchange(t *testing.T, w, r *tls.Conn, p []byte) {
	t.Helper()
	errs := make(chan error, 1)
	go func() { _, err := w.Write(p); errs <- err }()
	got := make([]byte, len(p))
	_ = r.SetReadDeadline(time.Now().Add(wait))
	if _, err := io.ReadFull(r, got); err != nil {
		t.Fatalf("read %d bytes: %v", len(p), err)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, p) {
		t.Fatalf("%d bytes arrived changed", len(p))
	}
}

// TestReleaseTLSBuffers: this Go's crypto/tls keeps its read buffers
// where releaseTLSBuffers looks for them (else idle TLS connections hold
// them again: the test says so rather than a benchmark weeks later); an
// idle session's buffers are dropped and it reads and writes on after,
// messages of one record and of several; a session holding bytes not
// yet read keeps them.
func TestReleaseTLSBuffers(t *testing.T) {
	if !tlsFields().ok {
		t.Fatal("crypto/tls.Conn no longer has rawInput, input and hand as bytes.Buffer/Reader: idle TLS sessions keep their read buffers")
	}
	cli, srv := tlsPair(t)
	for _, size := range []int{1, 700, 16 << 10, 40 << 10} {
		p := bytes.Repeat([]byte{byte(size)}, size)
		if !releaseTLSBuffers(srv) {
			t.Fatalf("before %d bytes: an idle session's buffers not dropped", size)
		}
		exchange(t, cli, srv, p)
		exchange(t, srv, cli, p)
	}

	// Two bytes in one record, one read: the other is the session's.
	go func() { _, _ = cli.Write([]byte("ab")) }()
	one := make([]byte, 1)
	if _, err := io.ReadFull(srv, one); err != nil || one[0] != 'a' {
		t.Fatalf("first byte %q %v", one, err)
	}
	if releaseTLSBuffers(srv) {
		t.Fatal("buffers dropped with a byte not yet read")
	}
	if _, err := io.ReadFull(srv, one); err != nil || one[0] != 'b' {
		t.Fatalf("byte held by the session: %q %v, want b", one, err)
	}
}

// batchConn holds what is written while hold is set, for flush to
// write at once: TLS records (and the WebSocket frames in them) that
// arrive together, as a fast client's do.
type batchConn struct {
	net.Conn
	mu   sync.Mutex
	hold bool
	buf  bytes.Buffer
}

func (c *batchConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.hold {
		return c.buf.Write(p)
	}
	return c.Conn.Write(p)
}

func (c *batchConn) flush(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hold = false
	if _, err := c.Conn.Write(c.buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	c.buf.Reset()
}

// TestEdgeBatchedMessages: messages whose records (TLS) or frames (WSS)
// arrive together with others are all answered, those the session still
// holds after a message read as well as those still in the socket, and
// so is one sent after the connection waited, whether the reader waited
// itself (linger) or handed the wait over at once (linger 0). Each row:
// linger, transport, messages per record, records per write.
func TestEdgeBatchedMessages(t *testing.T) {
	b1 := newUAS(t, "b1")
	s, cli := edgeServer(t, []*uas{b1}, nil)
	for _, tc := range []struct {
		linger           time.Duration
		tr               string
		perRecord, batch int
	}{
		{0, "tls", 1, 3},
		{0, "tls", 3, 1},
		{0, "tls", 2, 2},
		{0, "wss", 1, 3},
		{0, "wss", 3, 1},
		{0, "wss", 2, 2},
		{time.Minute, "tls", 2, 2},
		{time.Minute, "wss", 2, 2},
	} {
		s.tcp.linger.Store(int64(tc.linger))
		addr := s.TLSAddr()
		if tc.tr == "wss" {
			addr = s.WSSAddr()
		}
		raw, err := net.Dial("tcp", addr.String())
		if err != nil {
			t.Fatal(err)
		}
		bc := &batchConn{Conn: raw}
		sess := tls.Client(bc, cli)
		if tc.tr == "wss" {
			u, _ := url.Parse("wss://" + addr.String() + "/")
			if _, _, err := (ws.Dialer{Protocols: []string{"sip"}}).Upgrade(sess, u); err != nil {
				t.Fatal(err)
			}
		} else if err := sess.Handshake(); err != nil {
			t.Fatal(err)
		}
		n := 0
		msg := func() []byte {
			n++
			m := []byte(strings.Replace(optionsTo(s, raw.LocalAddr(), "batch-"+tc.tr+"-"+string(rune('a'+n))), "Max-Forwards: 70", "Max-Forwards: 0", 1))
			if tc.tr == "wss" {
				var f bytes.Buffer
				_ = ws.WriteFrame(&f, ws.MaskFrame(ws.NewTextFrame(m)))
				m = f.Bytes()
			}
			return m
		}
		send := func() {
			bc.mu.Lock()
			bc.hold = true
			bc.mu.Unlock()
			for range tc.batch {
				var rec []byte
				for range tc.perRecord {
					rec = append(rec, msg()...)
				}
				if _, err := sess.Write(rec); err != nil {
					t.Fatal(err)
				}
			}
			bc.flush(t)
		}
		read := func(k int) {
			t.Helper()
			c := &tcpClient{t: t, conn: sess}
			for range k {
				if tc.tr == "wss" {
					w := &wsClient{t: t, conn: sess}
					w.response(200)
					continue
				}
				c.response(200)
			}
		}
		send()
		read(tc.perRecord * tc.batch)
		time.Sleep(20 * time.Millisecond) // let the reader wait between messages; any wait passes
		send()
		read(tc.perRecord * tc.batch)
		raw.Close()
	}
}
