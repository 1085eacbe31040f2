package sip

import (
	"net"
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

// TestHeld2xxFollowerWaitsForItsBatch: a goroutine whose first 2xx joins
// the batch of a commit under way (another goroutine leads it) returns
// only once that 2xx is relayed, so the next message it reads on its
// connection (the callee's BYE right behind the 200) cannot overtake it.
// Before, it returned at once and relayed the BYE first.
func TestHeld2xxFollowerWaitsForItsBatch(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, nil)
	g := &gateDialogs{ok: true, called: make(chan []StoredDialog, 2), answer: make(chan struct{})}
	s.SetDialogStore(g)
	gc := s.dstore.Load().commit
	client, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	dst := target{addr: client.LocalAddr().(*net.UDPAddr).AddrPort()}
	now := s.clock.Now()
	reply := func(callID string) (uint64, *gosip.Response) {
		k := s.dialogs.key(callID, "f")
		if s.dialogs.claimIn(k, "", "b1", 0, now) != dialogInserted || !s.dialogs.confirm(k, "t-"+callID) {
			t.Fatalf("dialog %s not recorded", callID)
		}
		m, err := gosip.ParseMessage([]byte("SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bK-" + callID +
			"\r\nFrom: <sip:a@t>;tag=f\r\nTo: <sip:b@t>;tag=t-" + callID + "\r\nCall-ID: " + callID + "\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n"))
		if err != nil {
			t.Fatal(err)
		}
		return k, m.(*gosip.Response)
	}
	ka, ra := reply("call-a")
	kb, rb := reply("call-b")

	leaderDone := make(chan bool)
	go func() { leaderDone <- s.relayConfirmed(ka, ra, dst, now) }()
	select {
	case <-g.called: // the leader is in its commit of call-a
	case <-time.After(wait):
		t.Fatal("CommitDialogs not called")
	}
	followerDone := make(chan bool)
	go func() { followerDone <- s.relayConfirmed(kb, rb, dst, now) }()
	for end := time.Now().Add(wait); ; time.Sleep(time.Millisecond) {
		gc.mu.Lock()
		joined := len(gc.pending) == 1
		gc.mu.Unlock()
		if joined {
			break
		}
		if time.Now().After(end) {
			t.Fatal("call-b's 2xx did not join the next batch")
		}
	}
	select {
	case <-followerDone:
		t.Fatal("the follower returned before its 2xx was relayed")
	case <-time.After(100 * time.Millisecond):
	}
	g.answer <- struct{}{} // call-a's batch
	select {
	case <-g.called: // the leader goes on with call-b's batch
	case <-time.After(wait):
		t.Fatal("call-b's batch not committed")
	}
	g.answer <- struct{}{}
	for name, ch := range map[string]chan bool{"leader": leaderDone, "follower": followerDone} {
		select {
		case ok := <-ch:
			if !ok {
				t.Fatalf("%s: relayConfirmed did not take its 2xx", name)
			}
		case <-time.After(wait):
			t.Fatalf("%s did not return", name)
		}
	}
	// Both are in the client's socket, call-a's first.
	_ = client.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 65536)
	for _, want := range []string{"call-a", "call-b"} {
		n, err := client.Read(buf)
		if err != nil {
			t.Fatalf("waiting for %s's 200: %v", want, err)
		}
		m, err := gosip.ParseMessage(buf[:n])
		if err != nil || m.CallID().Value() != want {
			t.Fatalf("got %q, want %s's 200", buf[:n], want)
		}
	}
}
