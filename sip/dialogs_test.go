package sip

import (
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
)

func newDialogTable(ttl time.Duration, max int) *dialogTable {
	dt := &dialogTable{}
	dt.init(ttl, max)
	return dt
}

// TestDialogTableLookup: an entry keyed by Call-ID + caller tag is found
// by the caller's requests whatever their To-tag (forks share it), by the
// callee's requests (tags swapped) once the 2xx's To-tag is recorded, and
// by nothing else.
func TestDialogTableLookup(t *testing.T) {
	dt := newDialogTable(time.Hour, 10)
	if !dt.insert(dt.key("c1@h", "caller"), "b2", 0) {
		t.Fatal("insert refused")
	}
	cases := []struct {
		name         string
		callID       string
		from, to     string
		want         string // before the 2xx's To-tag is recorded; "" for a miss
		afterConfirm string // after
	}{
		{"caller, early (no To-tag)", "c1@h", "caller", "", "b2", "b2"},
		{"caller, confirmed", "c1@h", "caller", "callee", "b2", "b2"},
		{"caller, another fork's To-tag", "c1@h", "caller", "fork2", "b2", "b2"},
		{"callee, tags swapped", "c1@h", "callee", "caller", "", "b2"},
		{"callee of another fork", "c1@h", "fork2", "caller", "", ""},
		{"other Call-ID", "c2@h", "caller", "callee", "", ""},
		{"same Call-ID, other caller tag", "c1@h", "other", "callee", "", ""},
		{"Call-ID is case-sensitive", "C1@h", "caller", "callee", "", ""},
		{"no tags", "c1@h", "", "", "", ""},
	}
	check := func(confirmed bool) {
		for _, c := range cases {
			want := c.want
			if confirmed {
				want = c.afterConfirm
			}
			got, ok := dt.peek(c.callID, c.from, c.to, 1)
			if ok != (want != "") || got != want {
				t.Errorf("confirmed=%v %s: got %q/%v, want %q", confirmed, c.name, got, ok, want)
			}
		}
	}
	check(false)
	dt.confirm(dt.key("c1@h", "caller"), "callee")
	dt.confirm(dt.key("c1@h", "caller"), "fork2") // only the first 2xx's tag is kept
	check(true)
	if dt.Len() != 1 {
		t.Errorf("Len %d, want 1", dt.Len())
	}
}

// TestDialogTableMove: a failover's insert moves the entry to the new
// backend without adding one; a failed INVITE removes it.
func TestDialogTableMove(t *testing.T) {
	dt := newDialogTable(time.Hour, 10)
	k := dt.key("c1", "a")
	dt.insert(k, "b1", 0)
	dt.insert(k, "b2", 0)
	if id, _ := dt.lookup("c1", "a", "", 1); id != "b2" || dt.Len() != 1 {
		t.Errorf("after a move: %q, %d entries; want b2 and 1", id, dt.Len())
	}
	dt.remove(k)
	dt.remove(k) // twice: counted once
	if _, ok := dt.lookup("c1", "a", "", 1); ok || dt.Len() != 0 {
		t.Errorf("after remove: found %v, %d entries", ok, dt.Len())
	}
}

// TestDialogTableTTL: with a fake clock, an entry lives TTL after the last
// in-dialog request that found it; lookups ignore it once due, and the
// sweep frees it.
func TestDialogTableTTL(t *testing.T) {
	const ttl = time.Hour
	dt := newDialogTable(ttl, 10)
	dt.insert(dt.key("c1", "a"), "b1", 0)
	dt.insert(dt.key("c2", "a"), "b1", 0)
	at := func(d time.Duration) int64 { return int64(d) }
	if _, ok := dt.lookup("c1", "a", "x", at(59*time.Minute)); !ok { // refreshes c1 to 1h59m
		t.Fatal("c1 gone before its TTL")
	}
	if n := dt.sweep(at(ttl-1), dialogShards); n != 0 {
		t.Errorf("sweep before the TTL removed %d", n)
	}
	if _, ok := dt.peek("c2", "a", "", at(ttl)); ok {
		t.Error("c2 found at its deadline")
	}
	if _, ok := dt.peek("c1", "a", "", at(ttl+time.Minute)); !ok {
		t.Error("c1 not refreshed by the in-dialog request")
	}
	if n := dt.sweep(at(ttl), dialogShards); n != 1 || dt.Len() != 1 {
		t.Errorf("sweep at the TTL removed %d, left %d; want 1 and 1", n, dt.Len())
	}
	if _, ok := dt.peek("c1", "a", "", at(ttl+59*time.Minute)); ok {
		t.Error("c1 found an hour after its last request")
	}
	// The sweep scans a few shards per call and comes round to all.
	removed := 0
	for range dialogShards / dialogSweepShards {
		removed += dt.sweep(at(2*ttl), dialogSweepShards)
	}
	if removed != 1 || dt.Len() != 0 {
		t.Errorf("incremental sweep removed %d, left %d; want 1 and 0", removed, dt.Len())
	}
}

// TestDialogTableLinger: a final answer to a BYE, from either side, keeps
// the entry for dialogLinger: retransmitted BYEs still find it (each one
// extends the linger, not the TTL), then it goes.
func TestDialogTableLinger(t *testing.T) {
	dt := newDialogTable(time.Hour, 10)
	k := dt.key("c1", "caller")
	dt.insert(k, "b1", 0)
	dt.confirm(k, "callee")
	dt.ended("c1", "caller", "callee", 0) // the caller's BYE answered
	if _, ok := dt.lookup("c1", "caller", "callee", int64(dialogLinger)-1); !ok {
		t.Fatal("retransmitted BYE within the linger: miss")
	}
	end := 2*int64(dialogLinger) - 1
	if _, ok := dt.peek("c1", "caller", "callee", end-1); !ok {
		t.Error("linger not extended by the retransmission")
	}
	if _, ok := dt.peek("c1", "caller", "callee", end); ok {
		t.Error("found after the linger (a lingering entry must not get the TTL back)")
	}
	if n := dt.sweep(end, dialogShards); n != 1 {
		t.Errorf("sweep removed %d, want 1", n)
	}

	// The callee hung up: its BYE's answer carries From = callee.
	k = dt.key("c2", "caller")
	dt.insert(k, "b1", 0)
	dt.confirm(k, "callee")
	dt.ended("c2", "callee", "caller", 0)
	if _, ok := dt.peek("c2", "caller", "callee", int64(dialogLinger)); ok {
		t.Error("callee's BYE answer did not end the dialog")
	}
}

// TestDialogTableCap: at the entry cap inserts of new dialogs fail (moves
// of existing ones do not), concurrent inserts never overshoot it, and
// Bytes follows the entries.
func TestDialogTableCap(t *testing.T) {
	dt := newDialogTable(time.Hour, 3)
	for i := range 3 {
		if !dt.insert(dt.key(strconv.Itoa(i), "a"), "b1", 0) {
			t.Fatalf("insert %d refused below the cap", i)
		}
	}
	if dt.insert(dt.key("3", "a"), "b1", 0) {
		t.Error("insert over the cap accepted")
	}
	if !dt.insert(dt.key("0", "a"), "b2", 0) {
		t.Error("moving an existing dialog refused when full")
	}
	if dt.Len() != 3 || dt.Bytes() != 3*dialogEntryBytes {
		t.Errorf("Len %d Bytes %d, want 3 and %d", dt.Len(), dt.Bytes(), 3*dialogEntryBytes)
	}
	dt.remove(dt.key("1", "a"))
	if !dt.insert(dt.key("3", "a"), "b1", 0) {
		t.Error("insert refused after a removal made room")
	}

	const max, workers, each = 500, 8, 200
	dt = newDialogTable(time.Hour, max)
	var wg sync.WaitGroup
	var mu sync.Mutex
	accepted := 0
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 0
			for i := range each {
				if dt.insert(dt.key(fmt.Sprintf("%d-%d", w, i), "a"), "b1", 0) {
					n++
				}
			}
			mu.Lock()
			accepted += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	if accepted != max || dt.Len() != max {
		t.Errorf("concurrent inserts: %d accepted, %d entries; want %d", accepted, dt.Len(), max)
	}
}

// TestDialogTableBackendIDs: entries name backends by a registry index;
// ids are kept apart and survive being looked up from any entry.
func TestDialogTableBackendIDs(t *testing.T) {
	dt := newDialogTable(time.Hour, 100)
	ids := []string{"b1", "b2", "10.0.0.3:5060", "b1"}
	for i, id := range ids {
		dt.insert(dt.key(strconv.Itoa(i), "a"), id, 0)
	}
	for i, id := range ids {
		if got, _ := dt.peek(strconv.Itoa(i), "a", "", 0); got != id {
			t.Errorf("entry %d: backend %q, want %q", i, got, id)
		}
	}
	if n := len(dt.ids.Load().ids); n != 3 {
		t.Errorf("registry has %d ids, want 3", n)
	}
}

// TestDialogBytesPerEntry measures the heap of the table with
// runtime.MemStats over 100,000 entries and over a count just past a map
// growth (the worst point of the cycle), and checks that dialogEntryBytes,
// which Bytes and the cap's memory figure use, is an upper bound.
func TestDialogBytesPerEntry(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates about 20 MB")
	}
	worst := 0.0
	for _, n := range []int{100_000, 130_000} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		dt := newDialogTable(time.Hour, n)
		for i := range n {
			dt.insert(dt.key("call-"+strconv.Itoa(i)+"@host.example", "tag-"+strconv.Itoa(i)), "b1", 0)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		per := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
		runtime.KeepAlive(dt)
		t.Logf("%d entries: %.1f bytes per entry (1.8 M live dialogs: %.0f MB)", n, per, per*1.8e6/1e6)
		worst = max(worst, per)
	}
	if worst > dialogEntryBytes {
		t.Errorf("measured %.1f bytes per entry, over the accounted %d", worst, dialogEntryBytes)
	}
}

// TestTagParam: golden vectors of From/To values.
func TestTagParam(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"<sip:alice@a.example>;tag=1928301774", "1928301774"},
		{`"Bob" <sip:bob@b.example>;tag=a6c85cf`, "a6c85cf"},
		{"sip:alice@a.example;tag=abc", "abc"},
		{"<sip:alice@a.example;tag=uri-param>", ""},
		{"<sip:alice@a.example;tag=uri-param>;x=1;TAG=hdr ; y", "hdr"},
		{`"a;tag=q <x>" <sip:c@d>;tag=real`, "real"},
		{`"quote \" ;tag=no" <sip:c@d>;tag=esc`, "esc"},
		{"<sip:alice@a.example>", ""},
		{"<sip:alice@a.example>;tagx=1", ""},
		{"<sip:alice@a.example", ""},
		{"", ""},
		{"<sip:a@b>;tag=", ""},
		{"<sip:a@b>; tag = spaced ", "spaced"},
	} {
		if got := tagParam(c.in); got != c.want {
			t.Errorf("tagParam(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// BenchmarkDialogLookup is the hot path of a token-less in-dialog request.
func BenchmarkDialogLookup(b *testing.B) {
	dt := newDialogTable(time.Hour, 1<<20)
	const n = 100_000
	cids := make([]string, n)
	for i := range cids {
		cids[i] = "call-" + strconv.Itoa(i) + "@host.example"
		dt.insert(dt.key(cids[i], "from-tag"), "b1", 0)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, ok := dt.lookup(cids[i%n], "from-tag", "to-tag", 1); !ok {
				b.Fatal("miss")
			}
			i++
		}
	})
}

// BenchmarkDialogInsert inserts and removes, as an INVITE and its failed
// answer do.
func BenchmarkDialogInsert(b *testing.B) {
	dt := newDialogTable(time.Hour, 1<<20)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := uint64(fastRand())
		for pb.Next() {
			k := (i+1)*0x9e3779b97f4a7c15 | 1 // spread over the shards like hashed keys
			dt.insert(k, "b1", 0)
			dt.remove(k)
			i++
		}
	})
}

// TestDialogIDsReused: the backend id registry holds maxDialogIDs
// pool+id pairs; when it is full, a new pair takes the index of one no
// entry refers to any more (its dialogs removed, replaced or swept), and
// the entries of the others keep their backend. Only with every index in
// use is a new pair refused (dialogFull).
func TestDialogIDsReused(t *testing.T) {
	const maxDialogIDs = 64 // the registry's behaviour at its size, not its size
	dt := newDialogTable(time.Minute, 2*maxDialogIDs)
	dt.maxIDs = maxDialogIDs
	key := func(i int) uint64 { return dt.key("c"+strconv.Itoa(i), "tag") }
	const now = int64(time.Hour)
	for i := range maxDialogIDs {
		if got := dt.claimIn(key(i), "p", "b"+strconv.Itoa(i), 0, now); got != dialogInserted {
			t.Fatalf("claim %d: %d, want inserted", i, got)
		}
	}
	if got := dt.claimIn(key(-1), "p", "new1", 0, now); got != dialogFull {
		t.Fatalf("a new id with every index in use: %d, want dialogFull", got)
	}
	// A second dialog on b7 keeps b7's index in use after the first goes.
	if got := dt.claimIn(key(-7), "p", "b7", 0, now); got != dialogInserted {
		t.Fatal("second dialog of b7 refused")
	}
	dt.remove(key(7))
	if got := dt.claimIn(key(-1), "p", "new1", 0, now); got != dialogFull {
		t.Fatalf("b7 still has a dialog: %d, want dialogFull", got)
	}
	dt.remove(key(-7))
	dt.remove(key(5))
	for _, id := range []string{"new1", "new2"} {
		if got := dt.claimIn(dt.key(id, "tag"), "p", id, 0, now); got != dialogInserted {
			t.Fatalf("%s with free indexes: %d, want inserted", id, got)
		}
	}
	if got := dt.claimIn(key(-3), "p", "new3", 0, now); got != dialogFull {
		t.Fatalf("new3 with no free index left: %d, want dialogFull", got)
	}
	check := func(callID, wantPool, wantID string) {
		t.Helper()
		pool, id, ok := dt.lookupIn(callID, "tag", "", now, dialogPeek)
		if !ok || pool != wantPool || id != wantID {
			t.Errorf("%s: %q %q %v, want %q %q", callID, pool, id, ok, wantPool, wantID)
		}
	}
	check("new1", "p", "new1")
	check("new2", "p", "new2")
	check("c4", "p", "b4")
	check("c6", "p", "b6")
	check("c8", "p", "b8")
	// Replacing an entry (same key, another backend) frees the old index.
	if got := dt.claimIn(key(9), "p", "b10", 0, now); got != dialogInserted {
		t.Fatal("retry of c9's INVITE to b10 refused")
	}
	if got := dt.claimIn(key(-3), "p", "new3", 0, now); got != dialogInserted {
		t.Fatalf("new3 after b9's only dialog moved: %d, want inserted", got)
	}
	check("c9", "p", "b10")
	// Swept entries free theirs.
	dt.sweep(now+int64(2*time.Minute), dialogShards)
	if got := dt.claimIn(key(-4), "q", "new4", 0, now+int64(2*time.Minute)); got != dialogInserted {
		t.Fatalf("new4 after the sweep: %d, want inserted", got)
	}
	for i := range dt.refs {
		if n := dt.refs[i].Load(); n < 0 || n > 1 {
			t.Fatalf("index %d counts %d entries", i, n)
		}
	}
}

// TestDialogIDsReuseRace: claims of ids in a full registry, concurrent
// with removals, never leave an entry naming another backend than its
// own.
func TestDialogIDsReuseRace(t *testing.T) {
	const maxDialogIDs = 64
	dt := newDialogTable(time.Minute, 4*maxDialogIDs)
	dt.maxIDs = maxDialogIDs
	const now = int64(time.Hour)
	for i := range maxDialogIDs {
		dt.claimIn(dt.key("fill"+strconv.Itoa(i), "t"), "p", "fill"+strconv.Itoa(i), 0, now)
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				n := (w*500 + i) % maxDialogIDs
				dt.remove(dt.key("fill"+strconv.Itoa(n), "t"))
				id := "w" + strconv.Itoa(n%7) // ids shared between workers
				c := "x" + strconv.Itoa(w) + "-" + strconv.Itoa(i)
				if dt.claimIn(dt.key(c, "t"), "p", id, 0, now) != dialogInserted {
					continue
				}
				if _, got, ok := dt.lookupIn(c, "t", "", now, dialogPeek); !ok || got != id {
					t.Errorf("%s recorded %s, reads %q", c, id, got)
					return
				}
			}
		}()
	}
	wg.Wait()
}
