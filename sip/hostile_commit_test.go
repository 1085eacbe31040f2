package sip

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"
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
