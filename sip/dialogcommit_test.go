package sip

import (
	"sync"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"
)

// gateDialogs is a DialogCommitter that tells the test when CommitDialogs
// is called and answers only when the test lets it (a real one never
// waits): the test can look at what the client has while the 2xx is held.
type gateDialogs struct {
	ok     bool // what CommitDialogs answers
	called chan []StoredDialog
	answer chan struct{}
	mu     sync.Mutex
	writes int
}

func (g *gateDialogs) WriteDialogs(put []StoredDialog, del []uint64) {
	g.mu.Lock()
	g.writes += len(put) + len(del)
	g.mu.Unlock()
}

func (g *gateDialogs) CommitDialogs(put []StoredDialog) bool {
	g.called <- append([]StoredDialog(nil), put...)
	<-g.answer
	return g.ok
}

// TestDialogCommitBefore2xx: with a DialogCommitter, the first 2xx to an
// INVITE reaches the client only after its dialog's record was handed to
// CommitDialogs (the record names the backend, the 2xx's To-tag and a
// live expiry); a commit that fails still relays it, counted as unsafe;
// with a plain DialogWriter nothing is held.
func TestDialogCommitBefore2xx(t *testing.T) {
	for _, c := range []struct {
		name      string
		committer bool
		ok        bool
	}{
		{"committed", true, true},
		{"store down", true, false},
		{"plain writer", false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			b1 := newUAS(t, "b1")
			s := testServer(t, []*uas{b1}, nil, nil)
			g := &gateDialogs{ok: c.ok, called: make(chan []StoredDialog, 1), answer: make(chan struct{})}
			if c.committer {
				s.SetDialogStore(g)
			} else {
				s.SetDialogStore(&memDialogs{m: map[uint64]StoredDialog{}})
			}
			ua := newUAC(t, s.udpAddr())
			k := ua.newCall()
			k.invite("")
			ua.recvResponse(180)
			var committed StoredDialog
			if c.committer {
				var recs []StoredDialog
				select {
				case recs = <-g.called:
				case <-time.After(wait):
					t.Fatal("CommitDialogs not called")
				}
				// While the commit is under way, the 200 is not sent: a 200
				// sent before it would be in the client's socket already
				// (loopback delivers within the send).
				_ = ua.conn.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
				buf := make([]byte, 65536)
				for {
					n, _, err := ua.conn.ReadFromUDPAddrPort(buf)
					if err != nil {
						break
					}
					if m, err := gosip.ParseMessage(buf[:n]); err == nil {
						if res, ok := m.(*gosip.Response); ok && res.StatusCode == 200 {
							t.Fatal("200 relayed before its dialog was committed")
						}
					}
				}
				if len(recs) != 1 {
					t.Fatalf("committed %+v, want the call's one record", recs)
				}
				r := recs[0]
				if r.Key != s.dialogs.key(k.callID, "a"+k.callID) || r.Ref != "default\x00b1" || r.ToTag == 0 || r.Linger ||
					!r.Expires.After(time.Now()) {
					t.Fatalf("committed %+v: want key of the call, pool default and backend b1, a To-tag, a live expiry", r)
				}
				committed = r
				close(g.answer)
			}
			res := ua.recvResponse(200)
			k.learn(res)
			if c.committer {
				if committed.ToTag != s.dialogs.tagHash(k.toTag) {
					t.Fatalf("committed To-tag hash %d, the 200's is %d", committed.ToTag, s.dialogs.tagHash(k.toTag))
				}
			}
			held, unsafe := s.metrics.DialogStoreHeld.Load(), s.metrics.DialogStoreUnsafe.Load()
			wantHeld, wantUnsafe := uint64(0), uint64(0)
			if c.committer {
				wantHeld = 1
				if !c.ok {
					wantUnsafe = 1
				}
			}
			if held != wantHeld || unsafe != wantUnsafe {
				t.Fatalf("held %d, unsafe %d; want %d and %d", held, unsafe, wantHeld, wantUnsafe)
			}
			// The call goes on as without a store.
			k.inDialog("ACK", 1, k.branch+"-ack")
			k.inDialog("BYE", 2, k.branch+"-bye")
			ua.recvResponseTo(gosip.BYE, 200)
		})
	}
}
