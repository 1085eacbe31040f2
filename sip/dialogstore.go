package sip

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// The dialog table is written through to a store (SetDialogStore), so that
// a restarted balancer, even after kill -9, still sends the token-less
// in-dialog requests of calls set up before it to their backend
// (RestoreDialogs, before Start).
//
// The message path only marks the key of an entry it inserted, changed
// or removed: one non-blocking send on a bounded channel
// (dialogStoreQueue keys; beyond it the change is dropped and counted in
// Metrics.DialogStoreDropped). Every dialogStoreEvery the server's timer
// goroutine takes the marked keys, once each however often they changed,
// reads their entries as they are then, and hands the batch to the
// DialogWriter: live entries to put (with their deadline as a wall time),
// the others to delete. Entries the sweep expires are not deleted: the
// store drops them by their expiry too.

// dialogStoreQueue bounds the keys marked and not yet written: 512 KiB.
// At 10,000 calls/s, some 5 changes a call, a batch of dialogStoreEvery
// holds about 5,000.
const dialogStoreQueue = 1 << 16

// dialogStoreEvery is how often the marked entries are written: every
// other tick of the server's timer goroutine.
const dialogStoreEvery = 2

// dialogKeyLabel derives the dialog table's hash key from the affinity key
// ring: the same ring gives the same keys after a restart.
const dialogKeyLabel = "sluice sip dialog table v1"

// StoredDialog is one entry of the dialog table as a store keeps it.
type StoredDialog struct {
	// Key is the table's keyed hash of Call-ID and the caller's From-tag;
	// never 0. The hash key comes from the affinity key ring, so a key
	// means the same to the next process with the same ring.
	Key uint64
	// Ref names the dialog's pool and backend; store it as it is (at most
	// MaxStoredDialogRef bytes).
	Ref string
	// ToTag and Src are the hashes of the first 2xx's To-tag and of the
	// INVITE's source (0: none).
	ToTag uint32
	Src   uint16
	// Linger says a BYE was answered: the entry goes at Expires.
	Linger bool
	// Expires is when the entry expires unless an in-dialog request
	// refreshes it.
	Expires time.Time
}

// MaxStoredDialogRef is the longest Ref RestoreDialogs takes.
const MaxStoredDialogRef = 255

// DialogWriter receives the changes of the dialog table. WriteDialogs is
// called from the server's timer goroutine with the entries inserted or
// changed since the last call (put) and the keys of those removed (del);
// it must only queue them, never wait on a disk. The slices are the
// callee's.
type DialogWriter interface {
	WriteDialogs(put []StoredDialog, del []uint64)
}

// dialogChanges is the bounded queue of marked keys.
type dialogChanges struct {
	ch      chan uint64
	dropped *atomic.Uint64
}

// dialogStore is the write-through of a Server's table.
type dialogStore struct {
	w       DialogWriter
	changes *dialogChanges
	mu      sync.Mutex // one flush at a time
	keys    map[uint64]struct{}
	ticks   int
}

// mark queues key k to be written; it never blocks.
func (dt *dialogTable) mark(k uint64) {
	c := dt.changed.Load()
	if c == nil {
		return
	}
	select {
	case c.ch <- k:
	default:
		c.dropped.Add(1)
	}
}

// get returns the live entry of key k and its backend's registry name.
func (dt *dialogTable) get(k uint64, now int64) (dialogEntry, string, bool) {
	sh := dt.shard(k)
	sh.mu.Lock()
	e, ok := sh.m[k]
	sh.mu.Unlock()
	if !ok || now >= e.deadline {
		return dialogEntry{}, "", false
	}
	return e, dt.ids.Load().ids[e.backend()], true
}

// restore inserts entry e of backend ref under key k unless the key is
// taken or the table is full.
func (dt *dialogTable) restore(k uint64, ref string, e dialogEntry) bool {
	idx, ok := dt.hold(ref)
	if !ok {
		return false
	}
	e.meta = e.meta&entryLinger | idx
	sh := dt.shard(k)
	sh.mu.Lock()
	if _, exists := sh.m[k]; exists {
		sh.mu.Unlock()
		dt.release(idx)
		return false
	}
	if dt.count.Add(1) > dt.max {
		dt.count.Add(-1)
		sh.mu.Unlock()
		dt.release(idx)
		return false
	}
	sh.m[k] = e
	sh.mu.Unlock()
	return true
}

// SetDialogStore starts writing the dialog table through to w (nil
// stops it); changes made before are not written. Call it before Start
// (after RestoreDialogs), or while the server runs.
func (s *Server) SetDialogStore(w DialogWriter) {
	if w == nil {
		s.dialogs.changed.Store(nil)
		s.dstore.Store(nil)
		return
	}
	c := &dialogChanges{ch: make(chan uint64, dialogStoreQueue), dropped: &s.metrics.DialogStoreDropped}
	s.dstore.Store(&dialogStore{w: w, changes: c, keys: map[uint64]struct{}{}})
	s.dialogs.changed.Store(c)
}

// dialogStoreTick writes the marked entries every dialogStoreEvery calls;
// the timer goroutine calls it at each tick.
func (s *Server) dialogStoreTick(now int64) {
	st := s.dstore.Load()
	if st == nil {
		return
	}
	st.mu.Lock()
	st.ticks++
	due := st.ticks%dialogStoreEvery == 0
	st.mu.Unlock()
	if due {
		s.flushDialogStore(now, time.Now())
	}
}

// flushDialogStore hands the entries marked so far to the store: each
// key once, as its entry is at now (monotonic; wall is the same instant
// on the wall clock). It returns how many it put and deleted.
func (s *Server) flushDialogStore(now int64, wall time.Time) (put, del int) {
	st := s.dstore.Load()
	if st == nil {
		return 0, 0
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	// Only this goroutine receives, under mu: the len keys are there.
	for range len(st.changes.ch) {
		st.keys[<-st.changes.ch] = struct{}{}
	}
	if len(st.keys) == 0 {
		return 0, 0
	}
	var puts []StoredDialog
	var dels []uint64
	for k := range st.keys {
		e, ref, ok := s.dialogs.get(k, now)
		if !ok {
			dels = append(dels, k)
			continue
		}
		puts = append(puts, StoredDialog{Key: k, Ref: ref, ToTag: e.toTag, Src: e.src, Linger: e.linger(),
			Expires: wall.Add(time.Duration(e.deadline - now))})
	}
	clear(st.keys)
	st.w.WriteDialogs(puts, dels)
	return len(puts), len(dels)
}

// RestoreDialogs puts dialogs a store kept into the table, before Start,
// and returns how many it took. wall is the wall time now. It leaves out
// entries expired by then, ones whose Ref is not a backend name the table
// can have written or names no backend of the generation in force (or
// one outside the pool it names), ones whose INVITE had no 2xx (no To-tag, not
// lingering: only that INVITE's transaction, gone with the old process,
// would have removed them, so restored they would let any request with
// their Call-ID and From-tag pass as affinity, each refreshing them, for
// good) and, when the table is full, the rest; an entry keeps
// at most -sip-dialog-ttl (Timer F when lingering) from now, so a
// lowered TTL applies to restored entries too. Restored entries are not
// written back.
func (s *Server) RestoreDialogs(recs []StoredDialog, wall time.Time) int {
	now := s.clock.Now()
	p := s.pool.Load()
	n := 0
	for _, r := range recs {
		left := r.Expires.Sub(wall)
		if r.Key == 0 || left <= 0 || !validRef(r.Ref) || r.ToTag == 0 && !r.Linger || !p.restorable(r.Ref) {
			continue
		}
		e := dialogEntry{toTag: r.ToTag, src: r.Src}
		if r.Linger {
			e.meta = entryLinger
			left = min(left, dialogLinger)
		} else {
			left = min(left, time.Duration(s.dialogs.ttl))
		}
		e.deadline = now + int64(left)
		if s.dialogs.restore(r.Key, r.Ref, e) {
			n++
		}
	}
	return n
}

// restorable reports whether a stored dialog's ref names a backend of p
// (none when p is nil: no generation yet) in the pool it names. Another
// name would only hold an index of the table's backend registry for
// nothing (enough of them fill it, and new dialogs are then not
// recorded), and a backend outside the dialog's pool would take its
// requests metered as that pool.
func (p *backendSet) restorable(ref string) bool {
	if p == nil {
		return true
	}
	pool, id := splitRef(ref)
	b, _ := p.dialogBackend(id)
	return b != nil && (pool == "" || slices.Contains(b.spec.Pools, pool))
}

// DialogMax is the most entries the dialog table holds (-sip-dialog-max):
// more stored dialogs than this cannot be restored.
func (s *Server) DialogMax() int { return int(s.dialogs.max) }

// validRef reports whether ref is a registry name the table could have
// written: a backend id, with a valid pool name before a NUL.
func validRef(ref string) bool {
	if ref == "" || len(ref) > MaxStoredDialogRef {
		return false
	}
	pool, id := splitRef(ref)
	if id == "" {
		return false
	}
	if pool != "" || len(id) < len(ref) {
		return admission.CheckPoolName(pool) == nil
	}
	return true
}
