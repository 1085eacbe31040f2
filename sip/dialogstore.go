package sip

import (
	"bytes"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	gosip "github.com/emiago/sipgo/sip"

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

//
// A call's dialog is safe against kill -9 of this process before the call
// is: when the writer is a DialogCommitter, the first 2xx to an INVITE
// (the moment the caller has its call) is held until the dialog's record
// was handed to CommitDialogs, which only puts it where the death of this
// process cannot lose it (the store process's socket) and never waits.
// Held 2xx are group-committed: the goroutine that holds a 2xx while no
// commit is under way commits it at once (one non-blocking send, a few
// µs: the 2xx waits for nothing else) and relays it, then does the same
// for every 2xx other goroutines held meanwhile, in one send per batch;
// each of those goroutines waits until its 2xx is relayed, so the next
// message it reads on its connection cannot overtake it. A commit that
// fails (store down, socket full) still relays its 2xx (counted:
// Metrics.DialogStoreUnsafe): traffic never waits on the store's health.

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

// DialogCommitter is a DialogWriter that also makes confirmed dialogs
// safe before their 2xx is relayed. CommitDialogs hands it the records
// of dialogs whose first 2xx is held, and reports whether they are safe
// against kill -9 of this process once it returns; it must never wait on
// a disk or on the store's health (a few µs of a non-blocking send). It
// is called from one goroutine at a time; put is the callee's only for
// the call.
type DialogCommitter interface {
	DialogWriter
	CommitDialogs(put []StoredDialog) bool
}

// heldReply is a dialog-establishing 2xx waiting for its dialog's record
// to be committed: the response as it will be sent, and where.
type heldReply struct {
	rec StoredDialog
	buf *bytes.Buffer // from bufPool
	dst target
}

// dialogCommit is the group commit of held 2xx.
type dialogCommit struct {
	c DialogCommitter
	// commitMu makes the calls of CommitDialogs one at a time: commitHeld
	// and the read batch's commit (udpOut.commitLocked).
	commitMu sync.Mutex
	mu       sync.Mutex
	pending  []heldReply
	running  bool // a commitHeld runs
	// taken counts the batches a leader took from pending, relayed the
	// number of the last one it relayed; relayedCond (on mu) wakes the
	// goroutines waiting for theirs (relayConfirmed).
	taken, relayed uint64
	relayedCond    sync.Cond
	// spare and recs are commitHeld's slices, kept between leaders.
	spare []heldReply
	recs  []StoredDialog
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
	commit  *dialogCommit // nil: w is not a DialogCommitter
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
	st := &dialogStore{w: w, changes: c, keys: map[uint64]struct{}{}}
	if dc, ok := w.(DialogCommitter); ok {
		st.commit = &dialogCommit{c: dc}
		st.commit.relayedCond.L = &st.commit.mu
	}
	s.dstore.Store(st)
	s.dialogs.changed.Store(c)
}

// relayConfirmed relays res, the first 2xx to the INVITE of dialog k,
// once the dialog's record is committed (group commit, commitHeld), and
// reports whether it took res; false (the caller relays it) when there is
// no DialogCommitter or the entry is gone. now is the clock's.
func (s *Server) relayConfirmed(k uint64, res interface{ StringWrite(io.StringWriter) }, dst target, now int64) bool {
	st := s.dstore.Load()
	if st == nil || st.commit == nil {
		return false
	}
	e, ref, ok := s.dialogs.get(k, now)
	if !ok {
		return false
	}
	b := bufPool.Get().(*bytes.Buffer)
	b.Reset()
	res.StringWrite(b)
	h := heldReply{buf: b, dst: dst, rec: StoredDialog{Key: k, Ref: ref, ToTag: e.toTag, Src: e.src, Linger: e.linger(),
		Expires: time.Now().Add(time.Duration(e.deadline - now))}}
	gc := st.commit
	if !dst.tcp && s.udpOut != nil && len(b.Bytes()) <= maxDatagram && s.udpOut.queueHeld(s, gc, h.rec, b.Bytes(), dst.addr) {
		// In a read batch: one commit for the batch's 2xx, then they
		// leave with its queue, in the order produced (udpbatch.go).
		bufPool.Put(b)
		return true
	}
	gc.mu.Lock()
	gc.pending = append(gc.pending, h)
	start := !gc.running
	gc.running = true
	batch := gc.taken + 1 // the batch that will carry h
	if !start {
		// Another goroutine's commit is under way: wait (a few µs, a
		// non-blocking send) until it has relayed h too. Returning at
		// once let this goroutine read and relay its connection's next
		// message (a BYE right behind the 200) before the 200 itself.
		// A leader that panicked is not waited for (running false).
		for gc.relayed < batch && gc.running {
			gc.relayedCond.Wait()
		}
		gc.mu.Unlock()
		return true
	}
	gc.mu.Unlock()
	s.commitHeld(gc)
	return true
}

// learnDialog records the dialog of a 2xx to an INVITE relayed without
// its transaction (a retransmission by the backend at src) when the table
// does not hold it, and relays the 2xx held like a first one; it reports
// whether it took res. Only with a DialogCommitter: after a kill -9 that
// came between a backend's 2xx and its relay, the backend retransmits the
// 2xx until it has its ACK, the restarted balancer relays it, and the
// caller has its call; without this its token-less requests would find
// no dialog. The branch of res was checked to be ours for a request sent
// to src, so only a backend that took the INVITE names itself.
func (s *Server) learnDialog(res *gosip.Response, src source, dst target) bool {
	if st := s.dstore.Load(); st == nil || st.commit == nil || res.CallID() == nil {
		return false
	}
	f := header(res, "from", "f")
	tt := toTag(res)
	b := s.pool.Load().backendAt(src.addr)
	if f == nil || tt == "" || b == nil {
		return false
	}
	from := tagParam(f.Value())
	if from == "" {
		return false
	}
	now := s.clock.Now()
	k := s.dialogs.key(res.CallID().Value(), from)
	if _, _, ok := s.dialogs.get(k, now); ok {
		return false
	}
	pool := ""
	if len(b.spec.Pools) == 1 {
		pool = b.spec.Pools[0]
	}
	if s.dialogs.claimIn(k, pool, b.id, 0, now) != dialogInserted || !s.dialogs.confirm(k, tt) {
		return false
	}
	s.metrics.DialogsLearned.Add(1)
	return s.relayConfirmed(k, res, dst, now)
}

// commit calls CommitDialogs under commitMu, released however the call
// ends: a panic under it (recovered by the message handler) must not
// leave every later commit, and so every later call's first 2xx, blocked.
func (gc *dialogCommit) commit(recs []StoredDialog) bool {
	gc.commitMu.Lock()
	defer gc.commitMu.Unlock()
	return gc.c.CommitDialogs(recs)
}

// commitHeld commits the records of the held 2xx and relays them, batch
// after batch, until none is held. It runs on the goroutine that held a
// 2xx when no commit was under way (the leader); 2xx held by others
// meanwhile (TCP connections, the other listeners) join the next batch,
// so a busy balancer commits many calls with one send.
//
// A panic under it (the message handler recovers it, the listener lives
// on) must not leave running set: every later 2xx would join a batch no
// goroutine commits, held for good. The batch under way is lost with the
// panic; what others held meanwhile goes with the next leader.
func (s *Server) commitHeld(gc *dialogCommit) {
	done := false
	defer func() {
		if !done {
			gc.mu.Lock()
			gc.running = false
			gc.relayedCond.Broadcast()
			gc.mu.Unlock()
		}
	}()
	gc.mu.Lock()
	batch, recs := gc.spare, gc.recs
	gc.spare, gc.recs = nil, nil
	for len(gc.pending) > 0 {
		batch, gc.pending = gc.pending, batch[:0]
		gc.taken++
		n := gc.taken
		gc.mu.Unlock()
		recs = recs[:0]
		for _, h := range batch {
			recs = append(recs, h.rec)
		}
		ok := gc.commit(recs)
		if !ok {
			s.metrics.DialogStoreUnsafe.Add(uint64(len(batch)))
		}
		s.metrics.DialogStoreHeld.Add(uint64(len(batch)))
		for i, h := range batch {
			s.post(h.buf.Bytes(), h.dst, &s.metrics.Relayed)
			bufPool.Put(h.buf)
			batch[i] = heldReply{}
		}
		gc.mu.Lock()
		gc.relayed = n
		gc.relayedCond.Broadcast()
	}
	done = true
	gc.running = false
	gc.spare, gc.recs = batch[:0], recs[:0]
	gc.mu.Unlock()
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
	s.metrics.DialogsRestored.Add(uint64(n))
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
