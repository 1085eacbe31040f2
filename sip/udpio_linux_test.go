//go:build linux

package sip

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// udpBatch is the batch the reader tests read with.
const udpBatch = 16

// TestUDPReaderBatch: datagrams from several sockets, more than one batch
// of them, come out of the recvmmsg reader whole, in order, each with the
// address it came from.
func TestUDPReaderBatch(t *testing.T) {
	for _, tc := range []struct {
		name   string
		listen string
		peer   string
	}{
		{"ipv4", "127.0.0.1:0", "127.0.0.1"},
		{"ipv6 socket, ipv4 peer", "[::]:0", "127.0.0.1"},
		{"ipv6", "[::1]:0", "::1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(tc.listen)))
			if err != nil {
				t.Skipf("no %s socket here: %v", tc.listen, err)
			}
			defer ln.Close()
			_ = ln.SetReadBuffer(1 << 20) // every datagram below waits in it
			port := uint16(ln.LocalAddr().(*net.UDPAddr).Port)
			to := netip.AddrPortFrom(netip.MustParseAddr(tc.peer), port)
			r := newUDPReader(ln, udpBatch)
			if r == nil {
				t.Fatal("no reader")
			}
			var peers []*net.UDPConn
			for range 3 {
				c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(tc.peer), 0)))
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				peers = append(peers, c)
			}
			// The golden vector: datagram i from peer i%3, payload "m<i>"
			// padded to a size that grows with i (the last one larger than
			// a typical SIP message).
			const n = udpBatch*2 + 5
			want := make([][]byte, n)
			for i := range n {
				want[i] = append([]byte(fmt.Sprintf("m%d|", i)), bytes.Repeat([]byte{'x'}, i*97)...)
				if _, err := peers[i%3].WriteToUDPAddrPort(want[i], to); err != nil {
					t.Fatal(err)
				}
			}
			_ = ln.SetReadDeadline(time.Now().Add(5 * time.Second))
			got := 0
			for got < n {
				k, err := r.read()
				if err != nil {
					t.Fatalf("after %d datagrams: %v", got, err)
				}
				if k < 1 || k > udpBatch {
					t.Fatalf("read returned %d datagrams, want 1..%d", k, udpBatch)
				}
				for i := range k {
					data, from := r.datagram(i)
					if !bytes.Equal(data, want[got]) {
						t.Fatalf("datagram %d: got %q (%d bytes), want %d bytes", got, data[:min(len(data), 8)], len(data), len(want[got]))
					}
					wantFrom := peers[got%3].LocalAddr().(*net.UDPAddr).AddrPort()
					if from.Addr().Unmap() != wantFrom.Addr().Unmap() || from.Port() != wantFrom.Port() {
						t.Fatalf("datagram %d from %v, want %v", got, from, wantFrom)
					}
					got++
				}
			}
		})
	}
}

// TestUDPRawSend: the raw sendto reaches IPv4 and IPv6 peers from the
// socket's own address, and an address the socket cannot reach is left to
// net's call (handled false) rather than sent wrong.
func TestUDPRawSend(t *testing.T) {
	for _, tc := range []struct {
		name    string
		listen  string
		peer    string
		handled bool
	}{
		{"ipv4 to ipv4", "127.0.0.1:0", "127.0.0.1", true},
		{"ipv6 socket to ipv4", "[::]:0", "127.0.0.1", true},
		{"ipv6 to ipv6", "[::1]:0", "::1", true},
		{"ipv4 socket to ipv6", "127.0.0.1:0", "::1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(tc.listen)))
			if err != nil {
				t.Skipf("no %s socket here: %v", tc.listen, err)
			}
			defer ln.Close()
			peer, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(tc.peer), 0)))
			if err != nil {
				t.Skipf("no %s peer here: %v", tc.peer, err)
			}
			defer peer.Close()
			u := newUDPRaw(ln)
			if u == nil {
				t.Fatal("no raw sender")
			}
			msg := []byte("SIP/2.0 200 OK\r\n\r\n")
			handled, err := u.send(msg, peer.LocalAddr().(*net.UDPAddr).AddrPort())
			if handled != tc.handled {
				t.Fatalf("handled %v (err %v), want %v", handled, err, tc.handled)
			}
			if !handled {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 100)
			_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
			k, from, err := peer.ReadFromUDPAddrPort(buf)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf[:k], msg) {
				t.Fatalf("got %q, want %q", buf[:k], msg)
			}
			if from.Port() != uint16(ln.LocalAddr().(*net.UDPAddr).Port) {
				t.Fatalf("from %v, want port %d", from, ln.LocalAddr().(*net.UDPAddr).Port)
			}
		})
	}
}

// TestUDPRawSendClosed: a send on a closed socket fails with net.ErrClosed
// (sendBytes counts it), never on whatever descriptor took the number.
func TestUDPRawSendClosed(t *testing.T) {
	ln, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	u := newUDPRaw(ln)
	ln.Close()
	handled, err := u.send([]byte("x"), netip.MustParseAddrPort("127.0.0.1:9"))
	if !handled || err == nil {
		t.Fatalf("handled %v err %v, want an error", handled, err)
	}
	if r := newUDPReader(ln, udpBatch); r != nil {
		if _, err := r.read(); err == nil {
			t.Fatal("read on a closed socket: no error")
		}
	}
}

// TestUDPBatchConfig: -sip-udp-batch outside 1..MaxUDPBatch is refused
// with an error naming the field, the value and what is wanted; 0 takes
// the default.
func TestUDPBatchConfig(t *testing.T) {
	for _, tc := range []struct {
		batch int
		err   string
	}{
		{0, ""},
		{1, ""},
		{16, ""},
		{MaxUDPBatch, ""},
		{-1, "UDPBatch: -1: want 1..64"},
		{MaxUDPBatch + 1, "UDPBatch: 65: want 1..64"},
	} {
		c := DefaultConfig()
		c.UDPBatch = tc.batch
		c.setDefaults()
		err := c.Validate()
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("batch %d: %v", tc.batch, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("batch %d: error %v, want one with %q", tc.batch, err, tc.err)
		case tc.batch == 0 && c.UDPBatch != DefaultUDPBatch:
			t.Errorf("batch 0 became %d, want the default %d", c.UDPBatch, DefaultUDPBatch)
		}
	}
}
