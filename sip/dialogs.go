package sip

import (
	"crypto/rand"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The dialog table remembers which backend took each INVITE, so that
// in-dialog requests without our Route (UAs that ignore Record-Route, such
// as SIPp's built-in uac scenario) reach that backend even when the INVITE
// did not go to the Call-ID hash's pick: another policy than hash, a
// failover after a 503 or silence, a MOP refusal of the hash pick, or a
// hash pick that changed since (a backend draining, down or reloaded).
// Requests with a valid token never consult it; they stay stateless.
//
// Key. An entry is keyed by Call-ID + the caller's From-tag, both known
// when the INVITE is forwarded, so the entry exists before the 2xx is
// relayed and an ACK or BYE racing it finds its backend. The To-tag is
// not part of the key: every fork of the INVITE answers from behind the
// one backend we picked, so all early and confirmed dialogs of one INVITE
// share the entry. The To-tag of the first 2xx is recorded to recognise
// requests in the other direction (From-tag = the callee's tag, To-tag =
// the caller's), so a BYE from either side, and its answer, find the entry.
//
// Lifetime. Inserted (or moved) each time the INVITE is sent to a backend;
// removed on a non-2xx final answer to the INVITE, including our own;
// after a final answer to a BYE it lingers for Timer F (32 s) so
// retransmitted BYEs still reach the same backend; otherwise it expires
// after -sip-dialog-ttl without an in-dialog request (each one refreshes
// it). Expired entries are swept a few shards per tick of the server's
// timer goroutine, and ignored by lookups as soon as they are due.
//
// Size. Keys are 64-bit keyed hashes (SipHash-2-4, siphash.go, keyed from
// the affinity key ring, so nobody can craft collisions and the keys mean
// the same after a restart: the table is written through to the store,
// dialogstore.go) and values hold no pointer, so an
// entry has a fixed size and the map is never scanned by the garbage
// collector. The entry cap (-sip-dialog-max) is therefore also the byte
// cap: dialogEntryBytes each, measured by TestDialogBytesPerEntry. When
// the table is full, new dialogs are not inserted (counted; their
// token-less in-dialog requests fall back to the Call-ID hash).

// dialogShards is the number of independently locked parts of the table.
// A power of two; the shard is the key's top bits.
const dialogShards = 256

// dialogSweepShards is how many shards one sweep call scans: with the
// server's 50 ms tick, the whole table is scanned every 3.2 s.
const dialogSweepShards = 4

// dialogLinger keeps an entry after a final answer to a BYE, for
// retransmissions of the BYE (Timer F, 64·T1).
const dialogLinger = timerF

// dialogEntryBytes is the heap one entry costs, map overhead included,
// rounded up from the worst figure TestDialogBytesPerEntry measures over
// the map's growth cycle. Bytes() is Len() times this.
const dialogEntryBytes = 64

// dialogEntry is the value stored per dialog. It holds no pointer, and
// stays 16 bytes: the linger flag shares a word with the backend index.
type dialogEntry struct {
	deadline int64  // monotonic ns: expiry when idle, or end of the linger
	toTag    uint32 // hash of the first 2xx's To-tag; 0 before one is seen
	meta     uint16 // index into the backend id registry | entryLinger
	src      uint16 // hash of the INVITE's source (sourceTag); 0: another node's
}

// entryLinger is the flag of meta that says a BYE was answered:
// refreshes do not extend the entry.
const entryLinger = 1 << 15

func (e dialogEntry) backend() uint16 { return e.meta &^ entryLinger }
func (e dialogEntry) linger() bool    { return e.meta&entryLinger != 0 }

// What claim did.
const (
	dialogInserted = iota // recorded (new, or moved by the same INVITE's source)
	dialogFull            // not recorded: the table is full
	dialogRefused         // not recorded: another dialog holds the key
)

type dialogShard struct {
	mu sync.Mutex
	m  map[uint64]dialogEntry
	_  [40]byte // keep neighbouring shards' locks off one cache line
}

// dialogIDs is an immutable registry of backend ids, so entries store a
// small index instead of a string or a pointer. It is replaced whole when
// an id is seen for the first time (rare: configuration and reloads).
type dialogIDs struct {
	ids   []string
	index map[string]uint16
}

// maxDialogIDs bounds the registry. When it is full, a new id takes the
// index of one no entry refers to any more (dialogTable.refs): backends
// renamed by reload after reload cannot fill it for good. Only when every
// index is in use do inserts for new ids fail (dialogFull).
const maxDialogIDs = entryLinger

// refLocked is what an index's reference count holds while idIndex gives
// the index to another id: claimIn then looks the id up again.
const refLocked = -1 << 30

// dialogTable maps dialogs established through the balancer to the
// backend that took their INVITE. Safe for concurrent use; no lock is
// shared by all shards on the hot path.
type dialogTable struct {
	hkey   sipKey
	ttl    int64
	max    int64
	count  atomic.Int64
	shards [dialogShards]dialogShard
	next   atomic.Uint32 // next shard to sweep

	ids   atomic.Pointer[dialogIDs]
	idsMu sync.Mutex // serialises registry updates only
	// refs counts the entries that refer to each registry index; an index
	// at 0 may be given to another id when the registry is full.
	refs [maxDialogIDs]atomic.Int32
	// maxIDs is the registry's size: maxDialogIDs (smaller in tests).
	maxIDs int
	// changed, when set, receives the key of every entry inserted, changed
	// or removed (not those the sweep expires), for the store; it never
	// blocks (dialogstore.go).
	changed atomic.Pointer[dialogChanges]
}

func (dt *dialogTable) init(ttl time.Duration, max int) {
	var key [16]byte
	_, _ = rand.Read(key[:])
	dt.hkey = newSipKey(key[:])
	dt.ttl = int64(ttl)
	dt.max = int64(max)
	for i := range dt.shards {
		dt.shards[i].m = map[uint64]dialogEntry{}
	}
	dt.ids.Store(&dialogIDs{index: map[string]uint16{}})
	dt.maxIDs = maxDialogIDs
}

// key is the table key of the dialog with Call-ID callID and caller tag
// tag. It is never 0.
func (dt *dialogTable) key(callID, tag string) uint64 {
	h := dt.hkey.hash()
	h.writeString(callID)
	h.writeByte(0)
	h.writeString(tag)
	k := h.sum64()
	if k == 0 {
		k = 1
	}
	return k
}

// tagHash is the recorded form of a To-tag; never 0.
func (dt *dialogTable) tagHash(tag string) uint32 {
	h := dt.hkey.hash()
	h.writeString(tag)
	v := uint32(h.sum64())
	if v == 0 {
		v = 1
	}
	return v
}

func (dt *dialogTable) shard(k uint64) *dialogShard {
	return &dt.shards[k>>(64-8)]
}

// idIndex returns the registry index of backend id, adding it if new.
func (dt *dialogTable) idIndex(id string) (uint16, bool) {
	if i, ok := dt.ids.Load().index[id]; ok {
		return i, true
	}
	dt.idsMu.Lock()
	defer dt.idsMu.Unlock()
	cur := dt.ids.Load()
	if i, ok := cur.index[id]; ok {
		return i, true
	}
	if len(cur.ids) >= dt.maxIDs {
		return dt.reuseIndexLocked(cur, id)
	}
	next := &dialogIDs{ids: append(cur.ids[:len(cur.ids):len(cur.ids)], id), index: make(map[string]uint16, len(cur.index)+1)}
	for k, v := range cur.index {
		next.index[k] = v
	}
	i := uint16(len(cur.ids))
	next.index[id] = i
	dt.ids.Store(next)
	return i, true
}

// reuseIndexLocked gives id the index of an id no entry refers to, in the
// full registry cur, and reports false when every index is in use. The
// index's count is held at refLocked while the registry is replaced, so
// a claimIn that looked the former id up meanwhile sees the change and
// looks again (claimIn). The caller holds idsMu.
func (dt *dialogTable) reuseIndexLocked(cur *dialogIDs, id string) (uint16, bool) {
	for i := range cur.ids {
		if !dt.refs[i].CompareAndSwap(0, refLocked) {
			continue
		}
		next := &dialogIDs{ids: slices.Clone(cur.ids), index: make(map[string]uint16, len(cur.index))}
		for k, v := range cur.index {
			next.index[k] = v
		}
		delete(next.index, cur.ids[i])
		next.ids[i] = id
		next.index[id] = uint16(i)
		dt.ids.Store(next)
		dt.refs[i].Add(-refLocked) // keeps the counts of claimIns that looked meanwhile
		return uint16(i), true
	}
	return 0, false
}

// hold counts one more entry referring to the index of ref, looking it up
// (and adding it) again if the index was given to another id meanwhile.
func (dt *dialogTable) hold(ref string) (uint16, bool) {
	for {
		idx, ok := dt.idIndex(ref)
		if !ok {
			return 0, false
		}
		if n := dt.refs[idx].Add(1); n > 0 && dt.ids.Load().ids[idx] == ref {
			return idx, true
		}
		dt.refs[idx].Add(-1) // reused meanwhile: look again
	}
}

// release counts one entry less referring to index idx.
func (dt *dialogTable) release(idx uint16) { dt.refs[idx].Add(-1) }

// sourceTag is the recorded form of the source an INVITE came from; never 0.
func (dt *dialogTable) sourceTag(src source) uint16 {
	h := dt.hkey.hash()
	b := src.addr.Addr().Unmap().As16()
	h.writeBytes(b[:])
	h.writeByte(byte(src.addr.Port() >> 8))
	h.writeByte(byte(src.addr.Port()))
	if src.conn != nil {
		h.writeByte('T')
	}
	v := uint16(h.sum64())
	if v == 0 {
		v = 1
	}
	return v
}

// insert records that the INVITE of dialog k, sent by another node of the
// cluster, went to backend id at now. It reports whether it did (see claim;
// src 0).
func (dt *dialogTable) insert(k uint64, id string, now int64) bool {
	return dt.claim(k, id, 0, now) == dialogInserted
}

// dialogRef is the registry's name of backend id in pool: the pair,
// so an entry keeps the pool of its dialog at no cost in size. Neither
// an id nor a pool name holds a NUL.
func dialogRef(pool, id string) string {
	if pool == "" {
		return id
	}
	return pool + "\x00" + id
}

// splitRef is the inverse of dialogRef.
func splitRef(ref string) (pool, id string) {
	if i := strings.IndexByte(ref, 0); i >= 0 {
		return ref[:i], ref[i+1:]
	}
	return "", ref
}

// claim is claimIn without a pool (the dialog's pool unknown).
func (dt *dialogTable) claim(k uint64, id string, src uint16, now int64) int {
	return dt.claimIn(k, "", id, src, now)
}

// claimIn records that the INVITE of dialog k from the source with tag
// src (0: another node's) went to backend id of pool at now. It replaces a live entry
// only while that dialog is not confirmed and its INVITE came from the same
// source or another node: a later attempt or a retry of the same caller.
// A confirmed or ending dialog, or one another source set up, keeps its
// backend (dialogRefused): anyone who learns a Call-ID and From-tag could
// otherwise send an initial INVITE with them and move the victim's
// token-less in-dialog requests to the backend of its choice.
func (dt *dialogTable) claimIn(k uint64, pool, id string, src uint16, now int64) int {
	idx, ok := dt.hold(dialogRef(pool, id))
	if !ok {
		return dialogFull
	}
	sh := dt.shard(k)
	sh.mu.Lock()
	e, exists := sh.m[k]
	if exists && now < e.deadline &&
		(e.toTag != 0 || e.linger() || src != 0 && e.src != 0 && e.src != src) {
		sh.mu.Unlock()
		dt.release(idx)
		return dialogRefused
	}
	if !exists {
		// Reserve a place first, so concurrent inserts never overshoot
		// max (a CAS loop would do the same; add-check-undo is simpler).
		if dt.count.Add(1) > dt.max {
			dt.count.Add(-1)
			sh.mu.Unlock()
			dt.release(idx)
			return dialogFull
		}
	}
	sh.m[k] = dialogEntry{deadline: now + dt.ttl, meta: idx, src: src}
	sh.mu.Unlock()
	if exists {
		dt.release(e.backend())
	}
	dt.mark(k)
	return dialogInserted
}

// settledBy reports whether dialog k is live and confirmed (or ending)
// and its INVITE came from the source with tag src: an initial INVITE of
// that source with the same key is then a retransmission of the INVITE
// that set the dialog up.
func (dt *dialogTable) settledBy(k uint64, src uint16, now int64) bool {
	sh := dt.shard(k)
	sh.mu.Lock()
	e, ok := sh.m[k]
	sh.mu.Unlock()
	return ok && now < e.deadline && (e.toTag != 0 || e.linger()) && e.src == src
}

// confirm records the To-tag of the first 2xx to dialog k's INVITE, and
// reports whether it did (this 2xx is the first).
func (dt *dialogTable) confirm(k uint64, toTag string) bool {
	th := dt.tagHash(toTag)
	sh := dt.shard(k)
	sh.mu.Lock()
	e, ok := sh.m[k]
	first := ok && e.toTag == 0
	if first {
		e.toTag = th
		sh.m[k] = e
	}
	sh.mu.Unlock()
	if first {
		dt.mark(k)
	}
	return first
}

// remove forgets dialog k (its INVITE failed).
func (dt *dialogTable) remove(k uint64) {
	sh := dt.shard(k)
	sh.mu.Lock()
	e, ok := sh.m[k]
	if ok {
		delete(sh.m, k)
		dt.count.Add(-1)
	}
	sh.mu.Unlock()
	if ok {
		dt.release(e.backend())
		dt.mark(k)
	}
}

// What find does to the entry it finds.
const (
	dialogPeek    = iota // nothing
	dialogRefresh        // an in-dialog request: extend the idle deadline
	dialogEnd            // a final answer to a BYE: start the linger
)

// find returns the live entry that a message with these Call-ID and tags
// belongs to, in either direction: the caller's requests carry the key's
// tag as From-tag, the callee's as To-tag (and then the From-tag must be
// the recorded To-tag). It applies op to the entry under its shard lock.
func (dt *dialogTable) find(callID, fromTag, toTag string, now int64, op int) (dialogEntry, bool) {
	if e, ok := dt.findKey(dt.key(callID, fromTag), 0, now, op); ok {
		return e, true
	}
	if toTag == "" {
		return dialogEntry{}, false
	}
	return dt.findKey(dt.key(callID, toTag), dt.tagHash(fromTag), now, op)
}

// findKey is find for one key; with toTag not 0 the entry's recorded
// To-tag must be toTag.
func (dt *dialogTable) findKey(k uint64, toTag uint32, now int64, op int) (dialogEntry, bool) {
	sh := dt.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[k]
	if !ok || now >= e.deadline || toTag != 0 && e.toTag != toTag {
		return dialogEntry{}, false
	}
	switch {
	case op == dialogRefresh && e.linger():
		// A BYE after a final answer to a BYE: a retransmission, or a
		// retry after a challenge. Keep it for another linger.
		e.deadline = now + int64(dialogLinger)
	case op == dialogRefresh:
		e.deadline = now + dt.ttl
	case op == dialogEnd:
		e.meta |= entryLinger
		e.deadline = min(e.deadline, now+int64(dialogLinger))
	default:
		return e, true
	}
	sh.m[k] = e
	dt.mark(k)
	return e, true
}

// lookup returns the backend id of the dialog an in-dialog request
// belongs to, and refreshes its idle deadline (not past a linger).
func (dt *dialogTable) lookup(callID, fromTag, toTag string, now int64) (string, bool) {
	_, id, ok := dt.lookupIn(callID, fromTag, toTag, now, dialogRefresh)
	return id, ok
}

// peek is lookup without the refresh.
func (dt *dialogTable) peek(callID, fromTag, toTag string, now int64) (string, bool) {
	_, id, ok := dt.lookupIn(callID, fromTag, toTag, now, dialogPeek)
	return id, ok
}

// lookupIn returns the pool ("" when not recorded) and the backend id of
// the dialog an in-dialog request belongs to, applying op (dialogPeek or
// dialogRefresh).
func (dt *dialogTable) lookupIn(callID, fromTag, toTag string, now int64, op int) (pool, id string, ok bool) {
	e, ok := dt.find(callID, fromTag, toTag, now, op)
	if !ok {
		return "", "", false
	}
	pool, id = splitRef(dt.ids.Load().ids[e.backend()])
	return pool, id, true
}

// ended starts the linger of the dialog a final answer to a BYE belongs
// to; the sweep removes it afterwards.
func (dt *dialogTable) ended(callID, fromTag, toTag string, now int64) {
	dt.find(callID, fromTag, toTag, now, dialogEnd)
}

// sweep removes the expired entries of the next few shards. Called from
// the server's timer goroutine; tests call it with a fake clock.
func (dt *dialogTable) sweep(now int64, shards int) (removed int) {
	for range shards {
		sh := &dt.shards[(dt.next.Add(1)-1)%dialogShards]
		sh.mu.Lock()
		for k, e := range sh.m {
			if now >= e.deadline {
				delete(sh.m, k)
				dt.release(e.backend())
				removed++
			}
		}
		sh.mu.Unlock()
	}
	dt.count.Add(-int64(removed))
	return removed
}

// sweepAll removes the expired entries of every shard, each once, by
// index: sweep's round-robin cursor is shared with the timer goroutine,
// whose sweeps running at the same time would make a pass over
// dialogShards shards visit some twice and miss others.
func (dt *dialogTable) sweepAll(now int64) (removed int) {
	for i := range dt.shards {
		sh := &dt.shards[i]
		sh.mu.Lock()
		n := 0
		for k, e := range sh.m {
			if now >= e.deadline {
				delete(sh.m, k)
				dt.release(e.backend())
				n++
			}
		}
		sh.mu.Unlock()
		dt.count.Add(-int64(n))
		removed += n
	}
	return removed
}

// Len returns the number of entries (live and lingering or expired but
// not yet swept).
func (dt *dialogTable) Len() int { return int(dt.count.Load()) }

// Bytes returns the heap the entries take, by the measured per-entry cost.
func (dt *dialogTable) Bytes() int64 { return dt.count.Load() * dialogEntryBytes }

// tagParam returns the tag parameter of a From or To header value (name-addr
// or addr-spec with header parameters, RFC 3261 §20.20), "" when none. It
// skips a quoted display name and the <...> URI, whose own parameters are
// not the header's.
func tagParam(v string) string {
	i := 0
	// Parameters start after the URI: after '>' for a name-addr, else at
	// the first ';' of an addr-spec.
	if lt := indexOutsideQuotes(v, '<'); lt >= 0 {
		gt := strings.IndexByte(v[lt:], '>')
		if gt < 0 {
			return ""
		}
		i = lt + gt + 1
	}
	rest := v[i:]
	for {
		semi := strings.IndexByte(rest, ';')
		if semi < 0 {
			return ""
		}
		rest = rest[semi+1:]
		end := strings.IndexByte(rest, ';')
		p := rest
		if end >= 0 {
			p = rest[:end]
		}
		name, val, _ := strings.Cut(p, "=")
		if strings.EqualFold(strings.TrimSpace(name), "tag") {
			return strings.TrimSpace(val)
		}
	}
}

// indexOutsideQuotes is the index of c in v outside "quoted strings", or -1.
func indexOutsideQuotes(v string, c byte) int {
	quoted := false
	for i := 0; i < len(v); i++ {
		switch v[i] {
		case '\\':
			if quoted {
				i++
			}
		case '"':
			quoted = !quoted
		case c:
			if !quoted {
				return i
			}
		}
	}
	return -1
}
