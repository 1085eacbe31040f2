package sip

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// TestHostileRestoredUnconfirmedDialog: a dialog whose INVITE had no
// 2xx yet when the process ended. Its entry only lived as long as that
// INVITE's transaction, which removes it on a failure; the transaction
// died with the process, and nothing would ever confirm or remove a
// restored copy. Every request with its Call-ID and From-tag (any
// To-tag) would find it, pass as affinity (no ARM, no MOP) and refresh
// it for another -sip-dialog-ttl: a free pass for as long as the caller
// keeps sending. Such entries are not restored; confirmed and lingering
// ones are.
func TestHostileRestoredUnconfirmedDialog(t *testing.T) {
	clock := &admission.ManualClock{}
	clock.Set(int64(time.Hour))
	a := storeServer(t, testKey, clock)
	w := &memDialogs{m: map[uint64]StoredDialog{}}
	a.SetDialogStore(w)
	wall := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	a.ApplyDialog(DialogEvent{Op: DialogInsert, CallID: "pending", FromTag: "f", Backend: "b1"})
	a.ApplyDialog(DialogEvent{Op: DialogInsert, CallID: "confirmed", FromTag: "f", Backend: "b2"})
	a.ApplyDialog(DialogEvent{Op: DialogConfirm, CallID: "confirmed", FromTag: "f", ToTag: "t"})
	a.ApplyDialog(DialogEvent{Op: DialogInsert, CallID: "ending", FromTag: "f", Backend: "b1"})
	a.ApplyDialog(DialogEvent{Op: DialogConfirm, CallID: "ending", FromTag: "f", ToTag: "t"})
	a.ApplyDialog(DialogEvent{Op: DialogEnd, CallID: "ending", FromTag: "f"})
	a.flushDialogStore(clock.Now(), wall)

	clockB := &admission.ManualClock{}
	clockB.Set(int64(time.Second))
	b := storeServer(t, testKey, clockB)
	if n := b.RestoreDialogs(w.list(), wall.Add(time.Second)); n != 2 {
		t.Errorf("restored %d dialogs, want 2 (the confirmed and the ending one)", n)
	}
	for _, c := range []struct {
		callID, to string
		want       bool
	}{
		{"pending", "made-up", false},
		{"confirmed", "t", true},
		{"ending", "t", true},
	} {
		if _, ok := b.dialogs.peek(c.callID, "f", c.to, clockB.Now()); ok != c.want {
			t.Errorf("%s: found %v after the restart, want %v", c.callID, ok, c.want)
		}
	}
}

// TestHostileRestoredRefs: a damaged store whose dialogs name backends
// the server does not have, or a backend under a pool it is not in.
// Each distinct name took an index of the backend registry (32,768)
// for up to -sip-dialog-ttl: enough of them filled it, and no new
// dialog with a backend not yet named (one DNS just added) could be
// recorded. A dialog naming a backend of another pool would send its
// requests there, metered as the pool it names. Both are left out.
func TestHostileRestoredRefs(t *testing.T) {
	clock := &admission.ManualClock{}
	clock.Set(int64(time.Hour))
	s := storeServer(t, testKey, clock)
	s.dialogs.maxIDs = 8
	wall := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	var recs []StoredDialog
	for i := range 20 {
		recs = append(recs, StoredDialog{Key: uint64(100 + i), Ref: fmt.Sprintf("10.0.0.%d:5060", i), ToTag: 1, Expires: wall.Add(time.Hour)})
	}
	recs = append(recs,
		StoredDialog{Key: 1, Ref: "gold\x00b1", ToTag: 1, Expires: wall.Add(time.Hour)},    // b1 is not in pool gold
		StoredDialog{Key: 2, Ref: "default\x00b1", ToTag: 1, Expires: wall.Add(time.Hour)}, // it is in default
		StoredDialog{Key: 3, Ref: "b2", ToTag: 1, Expires: wall.Add(time.Hour)},
	)
	if n := s.RestoreDialogs(recs, wall); n != 2 {
		t.Errorf("restored %d dialogs, want 2", n)
	}
	if _, _, ok := s.dialogs.get(1, clock.Now()); ok {
		t.Error("the dialog naming b1 under pool gold was restored")
	}
	if r := s.dialogs.claimIn(s.dialogs.key("new", "f"), "", "10.9.9.9:5060", 1, clock.Now()); r != dialogInserted {
		t.Errorf("a new dialog with a backend not named before: %d, want inserted (the registry has room)", r)
	}
}
