//go:build linux

package http

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sluicelb/sluice/internal/benchcpu"
)

// unixPair is a connected pair of Unix stream sockets.
func unixPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// TestPeerClosed tells a socket pair end whose peer closed from one whose
// peer only shut down writing (the TLS bridge's question, loop engine).
func TestPeerClosed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		close func(c *net.UnixConn)
		want  bool
	}{
		{"closed", func(c *net.UnixConn) { c.Close() }, true},
		{"half-closed", func(c *net.UnixConn) { c.CloseWrite() }, false},
	} {
		a, b := unixPair(t)
		tc.close(b)
		io.ReadAll(a) // EOF, as the bridge sees it
		if got := peerClosed(a); got != tc.want {
			t.Errorf("%s: peerClosed %v, want %v", tc.name, got, tc.want)
		}
		a.Close()
		b.Close()
	}
}

// TestLoopTLSReadSettles: loopTLS.read starves the connection at once
// (no Read that would only block) exactly when tls.Conn holds nothing:
// one record read into a buffer larger than its plaintext. Two records
// fed at once, a buffer the plaintext fills, or a record still partial
// leave it to ask tls.Conn again, and that Read then blocks with nothing
// lost. TLS 1.2 and 1.3.
func TestLoopTLSReadSettles(t *testing.T) {
	msg := []byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	for _, v := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		p := newAdapterPair(t, v)
		lt := &loopTLS{conn: p.srv, rc: p.srvRC}
		record := func() []byte {
			if _, err := p.cli.Write(msg); err != nil {
				t.Fatal(err)
			}
			return bytes.Clone(p.cliRC.take())
		}
		for _, tc := range []struct {
			name    string
			records int // written, then fed at once
			split   bool
			rbuf    int
			starved bool
		}{
			{"one record", 1, false, 4096, true},
			{"one record in two pieces", 1, true, 4096, true},
			{"two records", 2, false, 4096, false},
			{"plaintext fills the buffer", 1, false, len(msg), false},
			{"a smaller buffer", 1, false, 10, false},
		} {
			var ct []byte
			for range tc.records {
				ct = append(ct, record()...)
			}
			buf := make([]byte, tc.rbuf)
			var got []byte
			if tc.split {
				p.srvRC.feed(ct[:len(ct)/2])
				if _, err := lt.read(buf); !wouldBlockErr(err) {
					t.Fatalf("TLS %x %s: half a record: %v, want would block", v, tc.name, err)
				}
				ct = ct[len(ct)/2:]
			}
			p.srvRC.feed(ct)
			n, err := lt.read(buf)
			if err != nil {
				t.Fatalf("TLS %x %s: %v", v, tc.name, err)
			}
			got = append(got, buf[:n]...)
			if lt.starved != tc.starved {
				t.Errorf("TLS %x %s: starved %v, want %v", v, tc.name, lt.starved, tc.starved)
			}
			for !lt.starved {
				n, err := lt.read(buf)
				got = append(got, buf[:n]...)
				if wouldBlockErr(err) {
					break
				}
				if err != nil {
					t.Fatalf("TLS %x %s: %v", v, tc.name, err)
				}
			}
			if want := bytes.Repeat(msg, tc.records); !bytes.Equal(got, want) {
				t.Fatalf("TLS %x %s: read %q, want %q", v, tc.name, got, want)
			}
			if p.srvRC.buffered() != 0 {
				t.Fatalf("TLS %x %s: %d bytes left in the adapter", v, tc.name, p.srvRC.buffered())
			}
			// Nothing is left in tls.Conn either: a Read blocks.
			if _, err := p.srv.Read(buf); !wouldBlockErr(err) {
				t.Fatalf("TLS %x %s: a Read after: %v, want would block", v, tc.name, err)
			}
			lt.starved = false
		}
	}
}

// BenchmarkLoopTLSRecords is the record layer's share of one HTTPS
// keep-alive request on the loop, over conns connections taken in turn
// (their TLS state cycling through the cache as the loop's do at that
// many clients): the client's request sealed, fed and read by the
// server's loopTLS, the answer sealed. "settled" is the loop's read (one
// tls.Conn.Read); "until-would-block" asks tls.Conn once more, until it
// would block, as the loop did before recordConn followed the record
// framing. TLS 1.3, AES-128-GCM; cpu-ns/op and allocs/op are the figures.
func BenchmarkLoopTLSRecords(b *testing.B) {
	req := []byte("GET / HTTP/1.1\r\nHost: 127.0.0.1:8443\r\nUser-Agent: bench\r\n\r\n")
	answer := []byte("HTTP/1.1 200 OK\r\nServer: nginx\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nb1\n")
	for _, conns := range []int{1, 50, 200} {
		pairs := make([]*adapterPair, conns)
		lts := make([]*loopTLS, conns)
		for i := range pairs {
			pairs[i] = newAdapterPair(b, tls.VersionTLS13)
			lts[i] = &loopTLS{conn: pairs[i].srv, rc: pairs[i].srvRC}
		}
		for _, mode := range []string{"settled", "until-would-block"} {
			b.Run(fmt.Sprintf("%s/conns=%d", mode, conns), func(b *testing.B) {
				buf := make([]byte, 4096)
				b.ReportAllocs()
				cpu0, ops := benchcpu.Now(), 0
				for b.Loop() {
					i := ops % conns
					ops++
					p, lt := pairs[i], lts[i]
					if _, err := p.cli.Write(req); err != nil {
						b.Fatal(err)
					}
					p.srvRC.feed(p.cliRC.take())
					n, err := lt.read(buf)
					if err != nil || n != len(req) {
						b.Fatal(n, err)
					}
					if mode != "settled" || !lt.starved {
						if _, err := lt.read(buf); !wouldBlockErr(err) {
							b.Fatal(err)
						}
					}
					lt.starved = false
					if _, err := p.srv.Write(answer); err != nil {
						b.Fatal(err)
					}
					p.srvRC.take()
				}
				benchcpu.Report(b, cpu0, ops)
			})
		}
	}
}

var (
	fuzzSettledOnce sync.Once
	fuzzSettledPair *adapterPair
)

// FuzzLoopTLSSettled: whatever the records (one to three client writes)
// and however their bytes are cut into pieces and read, whenever
// loopTLS.read says tls.Conn holds nothing more (starved), a Read of
// tls.Conn would block indeed, and the plaintext read is the plaintext
// written.
func FuzzLoopTLSSettled(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n"), uint8(1), []byte{}, uint16(4096))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n"), uint8(3), []byte{3, 50}, uint16(20))
	f.Add(bytes.Repeat([]byte("y"), 17000), uint8(2), []byte{200, 7}, uint16(65535))
	f.Fuzz(func(t *testing.T, msg []byte, writes uint8, cuts []byte, rbuf uint16) {
		if len(msg) == 0 || len(msg) > 20000 {
			return
		}
		fuzzSettledOnce.Do(func() { fuzzSettledPair = newAdapterPair(t, tls.VersionTLS13) })
		p := fuzzSettledPair
		lt := &loopTLS{conn: p.srv, rc: p.srvRC}
		var ct []byte
		for range int(writes%3) + 1 {
			if _, err := p.cli.Write(msg); err != nil {
				t.Fatal(err)
			}
			ct = append(ct, p.cliRC.take()...)
		}
		want := bytes.Repeat(msg, int(writes%3)+1)
		buf := make([]byte, max(int(rbuf), 1))
		probe := make([]byte, 1)
		var got []byte
		for i := 0; len(ct) > 0; i++ {
			n := len(ct)
			if len(cuts) > 0 {
				n = min(max(int(cuts[i%len(cuts)]), 1), len(ct))
			}
			p.srvRC.feed(ct[:n])
			ct = ct[n:]
			lt.starved = false
			for !lt.starved {
				m, err := lt.read(buf)
				got = append(got, buf[:m]...)
				if wouldBlockErr(err) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if lt.starved && p.srvRC.buffered() == 0 {
				if m, err := p.srv.Read(probe); !wouldBlockErr(err) {
					t.Fatalf("starved, yet tls.Conn gave %d bytes (%v)", m, err)
				}
			}
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("read %d bytes, want the %d written", len(got), len(want))
		}
	})
}
