package sip

import (
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
