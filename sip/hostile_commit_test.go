package sip

import (
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"net/url"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"
	"github.com/gobwas/ws"
)

// panicOnceDialogs is a DialogCommitter whose first CommitDialogs panics
// (a bug in a committer, or in the relay of a held 2xx, as the message
// handler's recover sees it); later calls commit.
type panicOnceDialogs struct {
	memDialogs
	calls    atomic.Int32
	panicked chan struct{}
}

func (p *panicOnceDialogs) CommitDialogs(put []StoredDialog) bool {
	if p.calls.Add(1) == 1 {
		close(p.panicked)
		panic("committer fault")
	}
	return true
}

// TestHostileCommitPanicHoldsNoLater2xx: a panic under the group commit
// of held 2xx (recovered by the message handler, which keeps the listener
// up) must not leave the commit marked as under way. Before, every later
// call's first 2xx joined a batch that no goroutine would ever commit:
// held for good (the caller never has its call; the held responses pile
// up in memory without bound).
func TestHostileCommitPanicHoldsNoLater2xx(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, nil)
	p := &panicOnceDialogs{memDialogs: memDialogs{m: map[uint64]StoredDialog{}}, panicked: make(chan struct{})}
	s.SetDialogStore(p)
	ua := newUAC(t, s.udpAddr())

	// The first call's 2xx meets the panic: lost with it.
	first := ua.newCall()
	first.invite("")
	select {
	case <-p.panicked:
	case <-time.After(wait):
		t.Fatal("CommitDialogs not called")
	}
	for end := time.Now().Add(wait); s.metrics.Panics.Load() == 0; runtime.Gosched() {
		if time.Now().After(end) {
			t.Fatal("the panic was not recovered by the message handler")
		}
	}

	// Every call after it is committed and answered.
	for i := range 3 {
		k := ua.newCall()
		k.invite("")
		if awaitFinal(ua, k.callID) == nil {
			t.Fatalf("call %d: no 200 (its 2xx is held for good)", i)
		}
	}
	if n := p.calls.Load(); n != 4 {
		t.Fatalf("CommitDialogs called %d times, want 4 (one per call)", n)
	}
}

// awaitFinal returns the next 2xx to the INVITE of callID, skipping
// every other message (the first call's 180 and 2xx retransmissions);
// nil when none comes within the wait bound.
func awaitFinal(ua *uac, callID string) *gosip.Response {
	for {
		m := ua.recv()
		if m == nil {
			return nil
		}
		if res, ok := m.(*gosip.Response); ok && res.StatusCode == 200 && res.CallID().Value() == callID {
			return res
		}
	}
}

// TestHostileTLSRecordHeldWhileIdle: bytes of a TLS record that came with
// the last message (its header, with the length of a full record) are
// held by the session while the connection waits for the next message,
// its read buffer grown to the whole record (some 17 KiB, outside the
// partial-message budget). The message timeout must bound that, as it
// does bytes that come during the wait. Before, the wait ran to the idle
// timeout: 22 bytes a connection held 17 KiB for minutes.
func TestHostileTLSRecordHeldWhileIdle(t *testing.T) {
	b1 := newUAS(t, "b1")
	s, cli := edgeServer(t, []*uas{b1}, func(c *Config) {
		c.TCPMessageTimeout = 200 * time.Millisecond
		c.TCPIdleTimeout = time.Hour
	})
	for _, tr := range []string{"tls", "wss"} {
		t.Run(tr, func(t *testing.T) {
			slow := s.metrics.TCPSlow.Load()
			addr := s.TLSAddr()
			if tr == "wss" {
				addr = s.WSSAddr()
			}
			raw, err := net.Dial("tcp", addr.String())
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			bc := &batchConn{Conn: raw}
			sess := tls.Client(bc, cli)
			if tr == "wss" {
				u, _ := url.Parse("wss://" + addr.String() + "/")
				if _, _, err := (ws.Dialer{Protocols: []string{"sip"}}).Upgrade(sess, u); err != nil {
					t.Fatal(err)
				}
			} else if err := sess.Handshake(); err != nil {
				t.Fatal(err)
			}
			// One record with a message, then a full-size record of which
			// only the header is sent, in one write.
			bc.mu.Lock()
			bc.hold = true
			bc.mu.Unlock()
			msg := []byte(strings.Replace(optionsTo(s, raw.LocalAddr(), "held-record-"+tr), "Max-Forwards: 70", "Max-Forwards: 0", 1))
			if tr == "wss" {
				var f bytes.Buffer
				_ = ws.WriteFrame(&f, ws.MaskFrame(ws.NewTextFrame(msg)))
				msg = f.Bytes()
			}
			if _, err := sess.Write(msg); err != nil {
				t.Fatal(err)
			}
			first := bc.buf.Len()
			if _, err := sess.Write(bytes.Repeat([]byte{'x'}, 16<<10)); err != nil {
				t.Fatal(err)
			}
			bc.mu.Lock()
			out := append([]byte(nil), bc.buf.Bytes()[:first+5]...)
			bc.buf.Reset()
			bc.mu.Unlock()
			if _, err := raw.Write(out); err != nil {
				t.Fatal(err)
			}
			if tr == "wss" {
				(&wsClient{t: t, conn: sess}).response(200)
			} else {
				(&tcpClient{t: t, conn: sess}).response(200)
			}

			// Closed by the message timeout, not the idle one.
			_ = raw.SetReadDeadline(time.Now().Add(wait))
			if _, err := io.Copy(io.Discard, raw); err != nil {
				t.Fatalf("connection holding part of a record still open after %s (message timeout 200ms): %v", wait, err)
			}
			if s.metrics.TCPSlow.Load() == slow {
				t.Fatal("the close is not counted as a message not complete in time")
			}
		})
	}
}
