package sip

import (
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// memDialogs is a DialogWriter that keeps what it is given, as a store.
type memDialogs struct {
	m     map[uint64]StoredDialog
	puts  int
	dels  int
	calls int
}

func (w *memDialogs) WriteDialogs(put []StoredDialog, del []uint64) {
	w.calls++
	w.puts += len(put)
	w.dels += len(del)
	for _, d := range put {
		w.m[d.Key] = d
	}
	for _, k := range del {
		delete(w.m, k)
	}
}

func (w *memDialogs) list() []StoredDialog {
	out := make([]StoredDialog, 0, len(w.m))
	for _, d := range w.m {
		out = append(out, d)
	}
	return out
}

// storeServer is a Server that is not started, on clock, with the affinity
// key key and a dialog TTL of 10 minutes.
func storeServer(t *testing.T, key []byte, clock admission.Clock) *Server {
	t.Helper()
	signer, err := lb.NewSigner(key)
	if err != nil {
		t.Fatal(err)
	}
	adm, err := admission.NewController(admission.ControllerConfig{}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Listen: "127.0.0.1:0", DialogTTL: 10 * time.Minute,
		Backends: []BackendConfig{{ID: "b1", Addr: "127.0.0.1:5071"}, {ID: "b2", Addr: "127.0.0.1:5072"}}}
	s, err := New(cfg, Deps{Admission: adm, Signer: signer, Clock: clock}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestDialogStoreWriteThrough: every change of the table reaches the
// writer once per flush, as the entry is at the flush: inserts, the
// 2xx's To-tag, refreshes (a later expiry), the linger after a BYE and
// removals; a flush with nothing marked writes nothing.
func TestDialogStoreWriteThrough(t *testing.T) {
	clock := &admission.ManualClock{}
	clock.Set(int64(time.Hour))
	s := storeServer(t, testKey, clock)
	w := &memDialogs{m: map[uint64]StoredDialog{}}
	s.SetDialogStore(w)
	wall := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	ttl := 10 * time.Minute

	s.ApplyDialog(DialogEvent{Op: DialogInsert, CallID: "c1", FromTag: "f1", Backend: "b1", Pool: "gold"})
	s.ApplyDialog(DialogEvent{Op: DialogConfirm, CallID: "c1", FromTag: "f1", ToTag: "t1"})
	s.ApplyDialog(DialogEvent{Op: DialogInsert, CallID: "c2", FromTag: "f2", Backend: "b2"})
	s.ApplyDialog(DialogEvent{Op: DialogInsert, CallID: "c3", FromTag: "f3", Backend: "b1"})
	if put, del := s.flushDialogStore(clock.Now(), wall); put != 3 || del != 0 {
		t.Fatalf("first flush put %d, deleted %d; want 3 and 0 (c1 inserted and confirmed once)", put, del)
	}
	k1, k2, k3 := s.dialogs.key("c1", "f1"), s.dialogs.key("c2", "f2"), s.dialogs.key("c3", "f3")
	want := map[uint64]StoredDialog{
		k1: {Key: k1, Ref: "gold\x00b1", ToTag: s.dialogs.tagHash("t1"), Expires: wall.Add(ttl)},
		k2: {Key: k2, Ref: "b2", Expires: wall.Add(ttl)},
		k3: {Key: k3, Ref: "b1", Expires: wall.Add(ttl)},
	}
	check := func(step string) {
		t.Helper()
		if len(w.m) != len(want) {
			t.Fatalf("%s: store holds %d dialogs, want %d", step, len(w.m), len(want))
		}
		for k, d := range want {
			if got := w.m[k]; got != d {
				t.Errorf("%s: stored %+v, want %+v", step, got, d)
			}
		}
	}
	check("inserted")
	if put, del := s.flushDialogStore(clock.Now(), wall); put+del != 0 || w.calls != 1 {
		t.Fatalf("flush of nothing put %d, deleted %d, called the writer %d times; want 0, 0, 1", put, del, w.calls)
	}

	// 2 minutes on: c2 refreshed by an in-dialog request, c3's INVITE failed,
	// c1's BYE answered.
	clock.Advance(2 * time.Minute)
	wall = wall.Add(2 * time.Minute)
	if _, ok := s.dialogs.lookup("c2", "f2", "", clock.Now()); !ok {
		t.Fatal("c2 not found")
	}
	s.ApplyDialog(DialogEvent{Op: DialogRemove, CallID: "c3", FromTag: "f3"})
	s.ApplyDialog(DialogEvent{Op: DialogEnd, CallID: "c1", FromTag: "f1", ToTag: "t1"})
	if put, del := s.flushDialogStore(clock.Now(), wall); put != 2 || del != 1 {
		t.Fatalf("second flush put %d, deleted %d; want 2 and 1", put, del)
	}
	delete(want, k3)
	want[k2] = StoredDialog{Key: k2, Ref: "b2", Expires: wall.Add(ttl)}
	want[k1] = StoredDialog{Key: k1, Ref: "gold\x00b1", ToTag: s.dialogs.tagHash("t1"), Linger: true, Expires: wall.Add(dialogLinger)}
	check("changed")
	// A peek is no change.
	s.dialogs.peek("c2", "f2", "", clock.Now())
	if put, del := s.flushDialogStore(clock.Now(), wall); put+del != 0 {
		t.Errorf("a peek wrote %d entries", put+del)
	}
	// Without a store, nothing is marked.
	s.SetDialogStore(nil)
	s.ApplyDialog(DialogEvent{Op: DialogInsert, CallID: "c4", FromTag: "f4", Backend: "b1"})
	if put, del := s.flushDialogStore(clock.Now(), wall); put+del != 0 {
		t.Errorf("without a store, a flush wrote %d entries", put+del)
	}
}

// TestDialogStoreRestore: what one server wrote, a new server with the
// same affinity key finds (both directions of the dialog), with expiries
// kept, expired and malformed records left out, and the TTL of the new
// configuration as a cap. With another key, the stored keys mean nothing.
func TestDialogStoreRestore(t *testing.T) {
	clock := &admission.ManualClock{}
	clock.Set(int64(time.Hour))
	a := storeServer(t, testKey, clock)
	w := &memDialogs{m: map[uint64]StoredDialog{}}
	a.SetDialogStore(w)
	wall := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	a.ApplyDialog(DialogEvent{Op: DialogInsert, CallID: "c1", FromTag: "f1", Backend: "b2", Pool: "default"})
	a.ApplyDialog(DialogEvent{Op: DialogConfirm, CallID: "c1", FromTag: "f1", ToTag: "t1"})
	a.ApplyDialog(DialogEvent{Op: DialogInsert, CallID: "c2", FromTag: "f2", Backend: "b1"})
	a.ApplyDialog(DialogEvent{Op: DialogConfirm, CallID: "c2", FromTag: "f2", ToTag: "t2"})
	a.ApplyDialog(DialogEvent{Op: DialogInsert, CallID: "c3", FromTag: "f3", Backend: "b1"})
	a.ApplyDialog(DialogEvent{Op: DialogEnd, CallID: "c3", FromTag: "f3"})
	a.flushDialogStore(clock.Now(), wall)
	recs := w.list()
	recs = append(recs,
		StoredDialog{Key: 0, Ref: "b1", Expires: wall.Add(time.Hour)},                       // key 0
		StoredDialog{Key: 7, Ref: "", Expires: wall.Add(time.Hour)},                         // no backend
		StoredDialog{Key: 8, Ref: "bad pool!\x00b1", Expires: wall.Add(time.Hour)},          // bad pool
		StoredDialog{Key: 9, Ref: "gold\x00", Expires: wall.Add(time.Hour)},                 // no id
		StoredDialog{Key: 10, Ref: "b1", Expires: wall.Add(-time.Second)},                   // expired
		StoredDialog{Key: 11, Ref: string(make([]byte, 256)), Expires: wall.Add(time.Hour)}, // too long
	)
	slices.SortFunc(recs, func(x, y StoredDialog) int { return int(x.Key>>1) - int(y.Key>>1) })

	// The restart: a new process, its monotonic clock elsewhere, 20 s later.
	clockB := &admission.ManualClock{}
	clockB.Set(int64(5 * time.Second))
	wallB := wall.Add(20 * time.Second)
	b := storeServer(t, testKey, clockB)
	if n := b.RestoreDialogs(recs, wallB); n != 3 {
		t.Fatalf("restored %d dialogs, want 3", n)
	}
	if st := b.Status().Dialogs; st.Entries != 3 || st.Restored != 3 || st.Max != b.DialogMax() || st.Bytes <= 0 {
		t.Errorf("status after the restore: %+v, want 3 entries, 3 restored, max %d", st, b.DialogMax())
	}
	for _, tc := range []struct {
		callID, from, to string
		pool, id         string
	}{
		{"c1", "f1", "", "default", "b2"},
		{"c1", "t1", "f1", "default", "b2"}, // the callee's BYE
		{"c2", "f2", "", "", "b1"},
		{"c3", "f3", "", "", "b1"},
	} {
		pool, id, ok := b.dialogs.lookupIn(tc.callID, tc.from, tc.to, clockB.Now(), dialogPeek)
		if !ok || pool != tc.pool || id != tc.id {
			t.Errorf("%s from %s: restored %q/%q %v, want %q/%q", tc.callID, tc.from, pool, id, ok, tc.pool, tc.id)
		}
	}
	// c2 expires 10 min after it was written (9 min 40 s after the
	// restart); c3 lingers for what was left of Timer F.
	left := int64(10*time.Minute - 20*time.Second)
	if _, ok := b.dialogs.peek("c2", "f2", "", clockB.Now()+left-1); !ok {
		t.Error("c2 gone before its stored expiry")
	}
	if _, ok := b.dialogs.peek("c2", "f2", "", clockB.Now()+left); ok {
		t.Error("c2 outlives its stored expiry")
	}
	if _, ok := b.dialogs.peek("c3", "f3", "", clockB.Now()+int64(dialogLinger-20*time.Second)); ok {
		t.Error("c3 lingers past the linger it had")
	}
	// A confirmed restored dialog keeps its backend against a new INVITE
	// with its Call-ID and From-tag.
	if r := b.dialogs.claimIn(b.dialogs.key("c1", "f1"), "", "b1", 99, clockB.Now()); r != dialogRefused {
		t.Errorf("claim of a restored confirmed dialog: %d, want refused", r)
	}
	// Restored entries are not written back, and a second restore of the
	// same records takes none (the keys are there).
	wb := &memDialogs{m: map[uint64]StoredDialog{}}
	b.SetDialogStore(wb)
	if n := b.RestoreDialogs(recs, wallB); n != 0 {
		t.Errorf("second restore took %d", n)
	}
	if r := b.Status().Dialogs.Restored; r != 3 {
		t.Errorf("status counts %d restored after a restore that took none, want 3", r)
	}
	if put, del := b.flushDialogStore(clockB.Now(), wallB); put+del != 0 {
		t.Errorf("restore wrote %d entries back", put+del)
	}

	// A lower TTL caps restored entries.
	c := storeServer(t, testKey, clockB)
	c.dialogs.ttl = int64(time.Minute)
	c.RestoreDialogs(recs, wallB)
	if _, ok := c.dialogs.peek("c2", "f2", "", clockB.Now()+int64(time.Minute)); ok {
		t.Error("a restored entry outlives the TTL in force")
	}

	// Another affinity key: the same records name other dialogs.
	d := storeServer(t, []byte("another key of thirty-two bytes!"), clockB)
	d.RestoreDialogs(recs, wallB)
	if _, ok := d.dialogs.peek("c1", "f1", "", clockB.Now()); ok {
		t.Error("a server with another key found a stored dialog")
	}
}

// TestDialogStoreQueueBound: changes beyond the queue are dropped and
// counted, never waited for.
func TestDialogStoreQueueBound(t *testing.T) {
	s := storeServer(t, testKey, &admission.ManualClock{})
	w := &memDialogs{m: map[uint64]StoredDialog{}}
	s.SetDialogStore(w)
	for k := range uint64(dialogStoreQueue + 10) {
		s.dialogs.mark(k + 1)
	}
	if d := s.metrics.DialogStoreDropped.Load(); d != 10 {
		t.Errorf("dropped %d changes, want 10", d)
	}
	// Marked keys with no entry are deletions.
	if put, del := s.flushDialogStore(0, time.Unix(0, 0)); put != 0 || del != dialogStoreQueue {
		t.Errorf("flush put %d, deleted %d; want 0 and %d", put, del, dialogStoreQueue)
	}
}

// TestDialogKeyStable: the table's keys are a function of the affinity
// key and the dialog only (golden values: a change of the hash would lose
// every stored dialog at the upgrade).
func TestDialogKeyStable(t *testing.T) {
	s := storeServer(t, testKey, &admission.ManualClock{})
	s2 := storeServer(t, testKey, &admission.ManualClock{})
	for _, tc := range [][2]string{{"a84b4c76e66710@pc33.atlanta.com", "1928301774"}, {"", ""}, {"x", "y"}} {
		if s.dialogs.key(tc[0], tc[1]) != s2.dialogs.key(tc[0], tc[1]) {
			t.Errorf("key of %q differs between two servers with one affinity key", tc)
		}
	}
	if k := s.dialogs.key("x", "y"); k != 0x952c0a5abb8f0d99 {
		t.Errorf("key of x/y with the test key: %#x, want 0x952c0a5abb8f0d99", k)
	}
	if s.dialogs.key("x", "y") == s.dialogs.key("xy", "") {
		t.Error("Call-ID and From-tag not separated in the key")
	}
}

// discardDialogs is a DialogWriter that drops what it is given.
type discardDialogs struct{ n int }

func (d *discardDialogs) WriteDialogs(put []StoredDialog, del []uint64) { d.n += len(put) + len(del) }

// BenchmarkDialogStoreCall is the dialog table's cost of one call with the
// write-through on: the INVITE's entry, its 2xx, the ACK and the BYE
// (refreshes), the BYE's answer (linger), and the call's share of a
// flush every 1000 calls (100 ms at 10,000 calls/s); "off" is the same
// without a store.
func BenchmarkDialogStoreCall(b *testing.B) {
	for _, store := range []bool{true, false} {
		name := "on"
		if !store {
			name = "off"
		}
		b.Run(name, func(b *testing.B) { benchDialogCall(b, store) })
	}
}

func benchDialogCall(b *testing.B, store bool) {
	clock := &admission.ManualClock{}
	signer, _ := lb.NewSigner(testKey)
	adm, _ := admission.NewController(admission.ControllerConfig{}, nil, 0)
	s, err := New(Config{Listen: "127.0.0.1:0", Backends: []BackendConfig{{ID: "b1", Addr: "127.0.0.1:5071"}}},
		Deps{Admission: adm, Signer: signer, Clock: clock}, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	if store {
		s.SetDialogStore(&discardDialogs{})
	}
	wall := time.Now()
	callIDs := make([]string, 1000)
	for i := range callIDs {
		callIDs[i] = fmt.Sprintf("a84b4c76e66710-%d@pc33.atlanta.example.com", i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		now := clock.Advance(100 * time.Microsecond)
		id := callIDs[i%len(callIDs)]
		k := s.dialogs.key(id, "1928301774")
		s.dialogs.remove(k) // the same Call-IDs again: start each call anew
		s.dialogs.claimIn(k, "", "b1", 7, now)
		s.dialogs.confirm(k, "a6c85cf")
		s.dialogs.lookup(id, "1928301774", "a6c85cf", now)
		s.dialogs.lookup(id, "1928301774", "a6c85cf", now)
		s.dialogs.ended(id, "1928301774", "a6c85cf", now)
		if i%1000 == 999 {
			s.flushDialogStore(now, wall)
		}
	}
}

// BenchmarkDialogKey is the table key of a typical Call-ID and tag.
func BenchmarkDialogKey(b *testing.B) {
	var dt dialogTable
	dt.init(time.Hour, 10)
	var sink uint64
	for range b.N {
		sink += dt.key("a84b4c76e66710@pc33.atlanta.example.com", "1928301774")
	}
	_ = sink
}
