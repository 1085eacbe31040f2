package persist

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/sluicelb/sluice/admission"
)

// Format 3 is a Badger database in the subdirectory db3 of the data
// directory, owned by the store process (see child.go). Its keys:
//
//	m/<MOPKey>                          learned MOP state (JSON)
//	ov                                  overrides (JSON list)
//	cn                                  cluster node count (decimal)
//	e/<ns:8><seq:8>                     event (JSON), by time
//	ek/<kind>\x00<ns:8><seq:8>          index by kind (empty value)
//	es/<subject>\x00<ns:8><seq:8>       index by subject (backend)
//	h/<resolution>\x00<ns:8>            dashboard history sample (TTL: retention)
//	d/<key:8>                           SIP dialog (TTL: its expiry)
const (
	db3Dir          = "db3"
	mopPrefix3      = "m/"
	overridesKey3   = "ov"
	clusterKey3     = "cn"
	eventPrefix3    = "e/"
	kindPrefix3     = "ek/"
	subjectPrefix3  = "es/"
	historyPrefix3  = "h/"
	dialogPrefix    = "d/"
	maxIndexedLabel = 512
)

// kv3 is an open format 3 database.
type kv3 struct {
	db  *badger.DB
	seq uint64 // last event sequence
}

func openKV3(dir string, log *slog.Logger) (*kv3, error) {
	db, err := openBadger(dir, false, log)
	if err != nil {
		return nil, err
	}
	k := &kv3{db: db}
	// The last sequence continues across restarts.
	err = db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Reverse: true, Prefix: []byte(eventPrefix3)})
		defer it.Close()
		it.Seek(append([]byte(eventPrefix3), 0xff))
		if it.Valid() {
			if key := it.Item().Key(); len(key) == len(eventPrefix3)+16 {
				k.seq = binary.BigEndian.Uint64(key[len(eventPrefix3)+8:])
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, err
	}
	return k, nil
}

func evSuffix(nanos int64, seq uint64) []byte {
	b := binary.BigEndian.AppendUint64(make([]byte, 0, 16), uint64(nanos))
	return binary.BigEndian.AppendUint64(b, seq)
}

func labelPrefix(prefix, label string) []byte {
	return append(append([]byte(prefix), label...), 0)
}

// load returns the learned states, overrides and cluster node count.
func (k *kv3) load() (response, error) {
	out := response{MOP: map[string]admission.MOPState{}, LastSeq: k.seq}
	err := k.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{PrefetchValues: true, Prefix: []byte(mopPrefix3)})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			key := string(it.Item().Key()[len(mopPrefix3):])
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			if err := checkMOPKey(key); err != nil {
				return fmt.Errorf("%w: learned state key %q: %v", ErrCorrupt, key, err)
			}
			st, err := decodeMOP(v)
			if err != nil {
				return fmt.Errorf("%w: learned state %q: %v", ErrCorrupt, key, err)
			}
			out.MOP[key] = st
		}
		if item, err := txn.Get([]byte(overridesKey3)); err == nil {
			v, err := item.ValueCopy(nil)
			if err != nil {
				return err
			}
			if out.Overrides, err = decodeOverrides(v); err != nil {
				return fmt.Errorf("%w: overrides: %v", ErrCorrupt, err)
			}
		} else if !errors.Is(err, badger.ErrKeyNotFound) {
			return err
		}
		if item, err := txn.Get([]byte(clusterKey3)); err == nil {
			v, err := item.ValueCopy(nil)
			if err != nil {
				return err
			}
			if out.ClusterNodes, err = decodeCluster(v); err != nil {
				return fmt.Errorf("%w: cluster node count: %v", ErrCorrupt, err)
			}
		} else if !errors.Is(err, badger.ErrKeyNotFound) {
			return err
		}
		return nil
	})
	return out, err
}

// write applies one write request in one batch.
func (k *kv3) write(req *request, now time.Time) error {
	wb := k.db.NewWriteBatch()
	defer wb.Cancel()
	for key, st := range req.MOP {
		if checkMOPKey(key) != nil || checkMOP(st) != nil {
			continue // the parent checked them; never store what load refuses
		}
		v, err := encodeMOP(st)
		if err != nil {
			return err
		}
		if err := wb.Set([]byte(mopPrefix3+key), v); err != nil {
			return err
		}
	}
	if req.Overrides != nil {
		v, err := json.Marshal(struct {
			Overrides []Override `json:"overrides"`
		}{*req.Overrides})
		if err != nil {
			return err
		}
		if err := wb.Set([]byte(overridesKey3), v); err != nil {
			return err
		}
	}
	if req.ClusterNodes > 0 {
		v, _ := json.Marshal(clusterState{Nodes: req.ClusterNodes})
		if err := wb.Set([]byte(clusterKey3), v); err != nil {
			return err
		}
	}
	seq := k.seq
	for _, se := range req.Events {
		ev := se.Event
		v, err := encodeEvent(ev)
		if err != nil {
			continue
		}
		n := se.Seq
		if n == 0 {
			seq++
			n = seq
		}
		seq = max(seq, n)
		sfx := evSuffix(unixNanos(ev.Time), n)
		if err := wb.Set(append([]byte(eventPrefix3), sfx...), v); err != nil {
			return err
		}
		if err := wb.Set(append(labelPrefix(kindPrefix3, cut(string(ev.Kind), maxIndexedLabel)), sfx...), nil); err != nil {
			return err
		}
		if ev.Subject != "" {
			if err := wb.Set(append(labelPrefix(subjectPrefix3, cut(ev.Subject, maxIndexedLabel)), sfx...), nil); err != nil {
				return err
			}
		}
	}
	for _, h := range req.History {
		if len(h.Data) > maxHistorySample || len(h.Resolution) > 16 {
			continue
		}
		key := binary.BigEndian.AppendUint64(labelPrefix(historyPrefix3, h.Resolution), uint64(unixNanos(h.Time)))
		e := badger.NewEntry(key, h.Data)
		keep := req.HistoryRetention
		if h.Keep > 0 && (keep <= 0 || h.Keep < keep) {
			keep = h.Keep
		}
		if keep > 0 {
			ttl := h.Time.Add(keep).Sub(now)
			if ttl <= 0 {
				continue
			}
			e = e.WithTTL(ttl)
		}
		if err := wb.SetEntry(e); err != nil {
			return err
		}
	}
	if err := k.batchDialogs(wb, req.Dialogs, now); err != nil {
		return err
	}
	for _, key := range req.DeleteDialogs {
		if err := wb.Delete(dialogKey(key)); err != nil {
			return err
		}
	}
	if err := wb.Flush(); err != nil {
		return err
	}
	k.seq = seq
	return nil
}

// writeDialogs commits dialog records (the journal's) in one batch.
func (k *kv3) writeDialogs(recs []DialogRecord, now time.Time) error {
	wb := k.db.NewWriteBatch()
	defer wb.Cancel()
	if err := k.batchDialogs(wb, recs, now); err != nil {
		return err
	}
	return wb.Flush()
}

// batchDialogs adds dialog puts and deletes to wb. They come in one list,
// in the order they were queued: a dialog removed and set up again (an
// INVITE answered 401, then sent again with the same Call-ID and
// From-tag) ends stored. A record already expired (a deletion has a zero
// Expires) removes what is stored under its key.
//
// A confirmed dialog (To-tag or linger) stored and not expired is never
// replaced by an unconfirmed record or a deletion: the table never turns
// a live confirmed dialog back (its INVITE's transaction is over), so
// such a record is an older state that reached the store late (a batch
// read before the 2xx, written after the journal committed the 2xx's
// record). Without this, that batch would unconfirm the dialog, and a
// restart would not restore it.
func (k *kv3) batchDialogs(wb *badger.WriteBatch, recs []DialogRecord, now time.Time) error {
	keep, err := k.confirmedLive(recs, now)
	if err != nil {
		return err
	}
	// The keys and values of the batch are cut from one allocation: Badger
	// holds them until the batch is flushed.
	size := 0
	for i := range recs {
		size += len(dialogPrefix) + 8 + 15 + len(recs[i].Backend)
	}
	arena := make([]byte, 0, size)
	for _, d := range recs {
		ttl := d.Expires.Sub(now)
		if weakDialog(d) && keep[d.Key] {
			continue
		}
		var key, val []byte
		arena, key = cut3(arena, appendDialogKey(arena, d.Key))
		if ttl <= 0 {
			if err := wb.Delete(key); err != nil {
				return err
			}
			continue
		}
		if len(d.Backend) > maxDialogBackend {
			continue
		}
		arena, val = cut3(arena, appendDialog(arena, d))
		if err := wb.SetEntry(badger.NewEntry(key, val).WithTTL(ttl + time.Second)); err != nil {
			return err
		}
	}
	return nil
}

// cut3 returns what grown appended to arena (which it extends, with no
// room to grow into the rest) and arena with it.
func cut3(arena, grown []byte) ([]byte, []byte) {
	return grown, grown[len(arena):len(grown):len(grown)]
}

// weakDialog reports whether d is a deletion (zero Expires) or an
// unconfirmed dialog: what never replaces a live confirmed one.
func weakDialog(d DialogRecord) bool {
	return d.Expires.IsZero() || d.ToTag == 0 && !d.Linger
}

// confirmedLive returns, among the keys of recs' unconfirmed records and
// deletions, those whose stored dialog is confirmed and not expired at
// now (nil when there is none).
func (k *kv3) confirmedLive(recs []DialogRecord, now time.Time) (map[uint64]bool, error) {
	var keep map[uint64]bool
	err := k.db.View(func(txn *badger.Txn) error {
		for _, d := range recs {
			if !weakDialog(d) {
				continue
			}
			item, err := txn.Get(dialogKey(d.Key))
			if errors.Is(err, badger.ErrKeyNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			err = item.Value(func(v []byte) error {
				st, err := decodeDialog(item.Key(), v)
				if err == nil && (st.ToTag != 0 || st.Linger) && st.Expires.After(now) {
					if keep == nil {
						keep = map[uint64]bool{}
					}
					keep[d.Key] = true
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	return keep, err
}

// maxAnswer bounds the events of one answer (JSON escaping aside, half a
// message): a query for all of a large log gets the first ones and More.
const maxAnswer = maxFrame / 2

// EventQuery selects events: those at or after Since and before Until
// (zero: no bound), of kind Kind and subject Subject when set. Limit is the
// most returned (0: all); with Newest the last Limit of them are returned
// and Omitted counts the older ones left out, else the first Limit and
// More says whether there were more. Events are listed oldest first.
type EventQuery struct {
	Since   time.Time `json:"since,omitzero"`
	Until   time.Time `json:"until,omitzero"`
	Kind    string    `json:"kind,omitempty"`
	Subject string    `json:"subject,omitempty"`
	Limit   int       `json:"limit,omitempty"`
	Newest  bool      `json:"newest,omitempty"`
}

// events answers q reading only the keys in its range: an index when a
// kind or subject is asked for (the kind's when both are), else the
// events by time.
func (k *kv3) events(q EventQuery) (response, error) {
	var out response
	prefix := []byte(eventPrefix3)
	indexed := false
	switch {
	case q.Kind != "":
		prefix, indexed = labelPrefix(kindPrefix3, q.Kind), true
	case q.Subject != "":
		prefix, indexed = labelPrefix(subjectPrefix3, q.Subject), true
	}
	lo := append(slices.Clone(prefix), evSuffix(unixNanos(q.Since), 0)...)
	hi := append(slices.Clone(prefix), evSuffix(math.MaxInt64, math.MaxUint64)...)
	if !q.Until.IsZero() {
		hi = append(slices.Clone(prefix), evSuffix(unixNanos(q.Until), 0)...)
	}
	size := 0
	err := k.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Reverse: q.Newest, Prefix: prefix, PrefetchValues: !indexed})
		defer it.Close()
		get := func(item *badger.Item) (admission.Event, bool, error) {
			var v []byte
			var err error
			if indexed {
				sfx := item.Key()[len(prefix):]
				ev, gerr := txn.Get(append([]byte(eventPrefix3), sfx...))
				if errors.Is(gerr, badger.ErrKeyNotFound) {
					return admission.Event{}, false, nil // swept
				} else if gerr != nil {
					return admission.Event{}, false, gerr
				}
				v, err = ev.ValueCopy(nil)
			} else {
				v, err = item.ValueCopy(nil)
			}
			if err != nil {
				return admission.Event{}, false, err
			}
			ev, err := decodeEvent(v)
			if err != nil {
				return ev, false, fmt.Errorf("%w: %v", ErrCorrupt, err)
			}
			if q.Subject != "" && ev.Subject != q.Subject {
				return ev, false, nil
			}
			return ev, true, nil
		}
		if q.Newest {
			it.Seek(hi)
			if it.Valid() && bytes.Equal(it.Item().Key(), hi) {
				it.Next() // Until is exclusive
			}
		} else {
			it.Seek(lo)
		}
		for ; it.Valid(); it.Next() {
			key := it.Item().Key()
			if !q.Newest && bytes.Compare(key, hi) >= 0 || q.Newest && bytes.Compare(key, lo) < 0 {
				break
			}
			if q.Limit > 0 && len(out.Events) >= q.Limit {
				if !q.Newest {
					out.More = true
					break
				}
				if q.Subject == "" || q.Kind == "" {
					out.Omitted++ // the index holds only matching keys
					continue
				}
			}
			ev, ok, err := get(it.Item())
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			if q.Limit > 0 && len(out.Events) >= q.Limit {
				out.Omitted++
				continue
			}
			if size += len(ev.Message) + len(ev.Subject) + len(ev.Kind) + 64; size > maxAnswer {
				out.More = true // the answer must fit one message: ask again from the last
				break
			}
			out.Events = append(out.Events, ev)
		}
		return nil
	})
	if q.Newest {
		slices.Reverse(out.Events)
	}
	return out, err
}

// sweep deletes events before `before` (zero: none by age), then the
// oldest beyond max (max < 0: no limit), with their index keys.
func (k *kv3) sweep(before time.Time, max int) (int, error) {
	var total int
	err := k.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(eventPrefix3)})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			total++
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	cutoff := int64(-1)
	if !before.IsZero() {
		cutoff = unixNanos(before)
	}
	wb := k.db.NewWriteBatch()
	defer wb.Cancel()
	deleted := 0
	err = k.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(eventPrefix3), PrefetchValues: true})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			key := it.Item().KeyCopy(nil)
			sfx := key[len(eventPrefix3):]
			old := int64(binary.BigEndian.Uint64(sfx)) < cutoff
			over := max >= 0 && total-deleted > max
			if !old && !over {
				break
			}
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			if err := wb.Delete(key); err != nil {
				return err
			}
			if ev, err := decodeEvent(v); err == nil {
				if err := wb.Delete(append(labelPrefix(kindPrefix3, cut(string(ev.Kind), maxIndexedLabel)), sfx...)); err != nil {
					return err
				}
				if ev.Subject != "" {
					if err := wb.Delete(append(labelPrefix(subjectPrefix3, cut(ev.Subject, maxIndexedLabel)), sfx...)); err != nil {
						return err
					}
				}
			}
			deleted++
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return deleted, wb.Flush()
}

// history returns up to limit (0: all) samples of resolution res at or
// after since, oldest first, and whether there are more.
func (k *kv3) history(res string, since time.Time, limit int) ([]HistorySample, bool, error) {
	var out []HistorySample
	more := false
	prefix := labelPrefix(historyPrefix3, res)
	err := k.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix, PrefetchValues: true})
		defer it.Close()
		for it.Seek(binary.BigEndian.AppendUint64(slices.Clone(prefix), uint64(unixNanos(since)))); it.Valid(); it.Next() {
			key := it.Item().Key()
			if len(key) != len(prefix)+8 {
				continue
			}
			if limit > 0 && len(out) >= limit {
				more = true
				break
			}
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			out = append(out, HistorySample{Time: time.Unix(0, int64(binary.BigEndian.Uint64(key[len(prefix):]))), Resolution: res, Data: v})
		}
		return nil
	})
	return out, more, err
}

// dialogs returns up to limit (0: all) dialogs with keys after after
// (all when after is 0) that expire after now, by key, and whether there
// are more.
// dialogPageMsg is dialogs as one journal message (version byte, then
// records as appendDialogRec writes them), built from the stored values
// without a DialogRecord or a string per record: the answer to a
// balancer restoring a million dialogs. The records are in key order, a
// record that does not decode is skipped, as dialogs does.
func (k *kv3) dialogPageMsg(now time.Time, after uint64, limit int) ([]byte, bool, error) {
	msg := []byte{journalVersion}
	more := false
	nowNs := unixNanos(now)
	err := k.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(dialogPrefix), PrefetchValues: true})
		defer it.Close()
		start := dialogKey(after)
		n := 0
		for it.Seek(start); it.Valid(); it.Next() {
			key := it.Item().Key()
			if after > 0 && bytes.Equal(key, start) {
				continue
			}
			if limit > 0 && n >= limit {
				more = true
				break
			}
			err := it.Item().Value(func(v []byte) error {
				if len(key) != len(dialogPrefix)+8 || len(v) < 15 || len(v) > 15+maxDialogBackend {
					return nil
				}
				exp := binary.BigEndian.Uint64(v)
				if exp > math.MaxInt64 || int64(exp) <= nowNs {
					return nil
				}
				msg = append(msg, key[len(dialogPrefix):]...)
				msg = append(msg, v[:14]...)              // expiry, To-tag hash, source hash
				msg = append(msg, v[14], byte(len(v)-15)) // linger, id length
				msg = append(msg, v[15:]...)
				n++
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	return msg, more, err
}

func (k *kv3) dialogs(now time.Time, after uint64, limit int) ([]DialogRecord, bool, error) {
	var out []DialogRecord
	more := false
	err := k.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(dialogPrefix), PrefetchValues: true})
		defer it.Close()
		start := dialogKey(after)
		for it.Seek(start); it.Valid(); it.Next() {
			if after > 0 && bytes.Equal(it.Item().Key(), start) {
				continue
			}
			if limit > 0 && len(out) >= limit {
				more = true
				break
			}
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			d, err := decodeDialog(it.Item().Key(), v)
			if err != nil || !d.Expires.After(now) {
				continue
			}
			out = append(out, d)
		}
		return nil
	})
	return out, more, err
}
