package persist

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// FormatVersion3 is the layout written when Config.Child is set: a Badger
// database in the subdirectory db3, owned by the store process.
const FormatVersion3 = 3

// v2Dir keeps the files of a migrated format 2 store, for the operator.
const v2Dir = "format2"

// openFormat3 opens the store as format 3: it migrates a format 2 store
// (and, through it, format 1) at open, starts the store process and waits
// up to Config.ChildStartTimeout for the stored state. It never hangs on
// the store process: past the timeout the store runs on what it holds
// and loads the rest when the process answers.
func openFormat3(cfg Config, log *slog.Logger) (*Store, error) {
	dir := cfg.Dir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create data directory %s: %w", dir, err)
	}
	unlock, err := lockDir(dir, false)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", dir, err)
	}
	s := &Store{
		cfg:        cfg,
		log:        log,
		fs:         cfg.fs,
		dir:        dir,
		unlock:     unlock,
		mop:        map[string]admission.MOPState{},
		quit:       make(chan struct{}),
		writerDone: make(chan struct{}),
		closeDone:  make(chan struct{}),
		savers:     make(map[*Saver]struct{}),
	}
	close(s.writerDone) // format 3 has no event writer goroutine in this process
	fail := func(err error) (*Store, error) {
		s.unlock() // a format 1 migration may have taken the lock anew
		s.removeTmp()
		return nil, err
	}
	if cfg.Reset {
		n, err := wipe(dir)
		if err != nil {
			return fail(fmt.Errorf("reset store %s: %w", dir, err))
		}
		log.Warn("data directory reset: learned rates and events discarded", "dir", dir, "files_removed", n)
	}
	rc := newRemote(s, cfg.Child, log)
	version, err := readStoreFile(filepath.Join(dir, formatFile))
	v := strings.TrimSpace(string(version))
	switch {
	case err == nil && v == strconv.Itoa(FormatVersion3):
	case err == nil && v == strconv.Itoa(FormatVersion) || errors.Is(err, fs.ErrNotExist) && holdsV2orV1(dir):
		// Format 2, or format 1 (which open turns into format 2 first).
		if err := s.open(); err != nil {
			return fail(err)
		}
		evs, err := s.readEvents(false, time.Time{}, 0)
		if err != nil {
			return fail(err)
		}
		rc.migrate = &migration{
			mop: maps.Clone(s.mop), overrides: slices.Clone(s.overrides), cn: s.clusterNodes,
			events: evs, finish: func() error { return s.finishMigration() },
		}
		s.segs, s.pending = nil, nil
	case errors.Is(err, fs.ErrNotExist):
		if err := writeAtomic(s.fs, dir, formatFile, []byte(strconv.Itoa(FormatVersion3)+"\n")); err != nil {
			return fail(fmt.Errorf("write format version to %s: %w", dir, err))
		}
	case err != nil:
		return fail(fmt.Errorf("open store %s: %s: %w", dir, formatFile, err))
	default:
		return fail(fmt.Errorf("open store %s: %w: %s: version %q, this sluice reads versions 1 to %d; %s",
			dir, ErrCorrupt, formatFile, v, FormatVersion3, resetHint))
	}
	s.rc = rc
	rc.start()
	t := time.NewTimer(cfg.ChildStartTimeout)
	defer t.Stop()
	select {
	case <-s.rc.up:
		s.rc.mu.Lock()
		corrupt := s.rc.corrupt
		s.rc.mu.Unlock()
		if corrupt != nil {
			// A record that does not decode: never reset by itself, and
			// no use retrying. Start-up stops, as for format 2.
			s.Close(context.Background())
			return nil, fmt.Errorf("open store %s: %w; %s", dir, corrupt, resetHint)
		}
	case <-t.C:
		log.Error("STORE PROCESS DID NOT START: sluice runs on default learned rates and no overrides until it does; "+
			"it is restarted with backoff and the stored state is loaded when it answers",
			"dir", dir, "waited", cfg.ChildStartTimeout.String(), "last_exit", s.Health().ChildLastExit)
	}
	return s, nil
}

// isFormat3 reports whether dir holds a format 3 store.
func isFormat3(dir string) bool {
	v, err := readStoreFile(filepath.Join(dir, formatFile))
	return err == nil && strings.TrimSpace(string(v)) == strconv.Itoa(FormatVersion3)
}

// openReadOnly3 opens the Badger database of a stopped sluice read-only
// in this process, for `sluice events`; one that a killed store process
// left with a write-ahead log to replay is read from a temporary copy, so
// the store is never changed. (While sluice runs, the directory lock
// refuses this open: Badger's own lock would too.) Reading cannot raise
// SIGBUS on a full disk: nothing is written through a mapping.
func (s *Store) openReadOnly3() error {
	db3 := filepath.Join(s.cfg.Dir, db3Dir)
	var err error
	var k *kv3
	if hasWAL(db3) {
		db, tmp, cerr := openCopy(db3, s.log)
		if cerr != nil {
			return fmt.Errorf("open store %s: %w", s.cfg.Dir, cerr)
		}
		s.tmpDir = tmp
		k = &kv3{db: db}
	} else {
		db, oerr := openBadger(db3, true, s.log)
		if oerr != nil {
			return fmt.Errorf("open store %s: %w", s.cfg.Dir, oerr)
		}
		k = &kv3{db: db}
	}
	resp, err := k.load()
	if err != nil {
		k.db.Close()
		return fmt.Errorf("open store %s: %w", s.cfg.Dir, err)
	}
	s.ro = k
	s.mop = resp.MOP
	s.overrides = resp.Overrides
	s.clusterNodes = resp.ClusterNodes
	return nil
}

// holdsV2orV1 reports whether dir holds format 2 files or a format 1
// (Badger) store without a format file.
func holdsV2orV1(dir string) bool {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		n := e.Name()
		if n == mopFile || n == overridesFile || n == clusterFile || isSegmentName(n) || isBadgerFile(n) {
			return true
		}
	}
	return false
}

// finishMigration runs once the format 2 records are in the store
// process: it writes the format file (3) and moves the format 2 files
// into format2/, kept for the operator. A crash before the format file is
// written migrates again at the next start (the writes are idempotent,
// events aside: they would be there twice).
func (s *Store) finishMigration() error {
	dir := s.cfg.Dir
	if err := writeAtomic(s.fs, dir, formatFile, []byte(strconv.Itoa(FormatVersion3)+"\n")); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(dir, v2Dir), 0o700); err != nil {
		return err
	}
	for _, e := range entries {
		n := e.Name()
		if n == mopFile || n == overridesFile || n == clusterFile || isSegmentName(n) {
			if err := os.Rename(filepath.Join(dir, n), filepath.Join(dir, v2Dir, n)); err != nil {
				return err
			}
		}
	}
	return nil
}

// merge takes the state the store process loaded: a key the balancer
// saved since Open keeps its newer value.
func (s *Store) merge(resp response) {
	s.mopMu.Lock()
	for k, v := range resp.MOP {
		if _, ok := s.mop[k]; !ok {
			s.mop[k] = v
		}
	}
	s.mopMu.Unlock()
	s.ovMu.Lock()
	if len(s.overrides) == 0 {
		s.overrides = resp.Overrides
	}
	if s.clusterNodes == 0 {
		s.clusterNodes = resp.ClusterNodes
	}
	s.ovMu.Unlock()
}

// Query returns the events q selects (see EventQuery), oldest first, with
// More (Limit cut the answer) and Omitted (with Newest, how many older
// ones were left out). A format 3 store reads only the keys of the range
// and, with Kind or Subject, of that index; format 2 reads the segments
// that overlap the range and filters.
func (s *Store) Query(q EventQuery) (evs []admission.Event, more bool, omitted int, err error) {
	if err := s.checkOpen(); err != nil {
		return nil, false, 0, fmt.Errorf("read events from %s: %w", s.cfg.Dir, err)
	}
	if s.rc != nil || s.ro != nil {
		var resp response
		var err error
		if s.ro != nil {
			resp, err = s.ro.events(q)
		} else {
			resp, err = s.rc.call(&request{Op: opEvents, Query: &q})
		}
		if err != nil {
			return nil, false, 0, fmt.Errorf("read events from %s: %w", s.cfg.Dir, err)
		}
		return resp.Events, resp.More, resp.Omitted, nil
	}
	all, err := s.readEvents(false, q.Since, 0)
	if err != nil {
		return nil, false, 0, err
	}
	all = slices.DeleteFunc(all, func(ev admission.Event) bool {
		return q.Kind != "" && string(ev.Kind) != q.Kind || q.Subject != "" && ev.Subject != q.Subject ||
			!q.Until.IsZero() && !ev.Time.Before(q.Until)
	})
	if q.Limit <= 0 || len(all) <= q.Limit {
		return all, false, 0, nil
	}
	if q.Newest {
		return all[len(all)-q.Limit:], false, len(all) - q.Limit, nil
	}
	return all[:q.Limit], true, 0, nil
}

// SaveHistory queues samples of the dashboard's history for the store
// process (format 3; a format 2 store keeps no history and drops them).
// Samples older than Config.HistoryRetention age out. It never blocks.
func (s *Store) SaveHistory(samples []HistorySample) {
	if s.rc == nil || s.isClosed() {
		return
	}
	s.rc.queueHistory(samples)
}

// LoadHistory returns the stored samples of resolution res at or after
// since, oldest first; call it at start to fill the dashboard's rings.
//
// At most max samples are returned (max <= 0: all), so a damaged store
// cannot make the caller allocate without bound.
func (s *Store) LoadHistory(res string, since time.Time, max int) ([]HistorySample, error) {
	if s.rc == nil {
		return nil, nil
	}
	var out []HistorySample
	for {
		resp, err := s.rc.call(&request{Op: opHistory, Query: &EventQuery{Kind: res}, Since: since, Limit: historyPage})
		if err != nil {
			return out, fmt.Errorf("load history from %s: %w", s.cfg.Dir, err)
		}
		out = append(out, resp.History...)
		if max > 0 && len(out) >= max {
			return out[:max], nil
		}
		if !resp.More || len(resp.History) == 0 {
			return out, nil
		}
		since = resp.History[len(resp.History)-1].Time.Add(time.Nanosecond)
	}
}

// PutDialogs queues dialog records (new, or changed: To-tag seen, linger,
// expiry moved) for the store process; each is dropped from the store at
// its Expires. It never blocks; beyond Config.QueueMax waiting records
// the oldest are dropped and counted (Health.QueueDropped).
func (s *Store) PutDialogs(batch []DialogRecord) {
	if s.rc == nil || s.isClosed() || len(batch) == 0 {
		return
	}
	s.rc.queueDialogs(batch, nil)
}

// DeleteDialogs queues the removal of the dialogs of keys.
func (s *Store) DeleteDialogs(keys []uint64) {
	if s.rc == nil || s.isClosed() || len(keys) == 0 {
		return
	}
	s.rc.queueDialogs(nil, keys)
}

// LoadDialogs returns the stored dialogs that expire after now, at most
// max of them (max <= 0: all; the dialog table's cap, so a damaged store
// cannot make the caller allocate without bound); call it before the SIP
// listener opens. EachDialogs does the same a page at a time.
func (s *Store) LoadDialogs(now time.Time, max int) ([]DialogRecord, error) {
	var out []DialogRecord
	_, err := s.EachDialogs(now, max, func(page []DialogRecord) { out = append(out, page...) })
	return out, err
}

// EachDialogs hands the stored dialogs that expire after now to fn, one
// page of the store process's answers at a time (at most dialogPage), at
// most max in all (max <= 0: all), and returns how many it handed. fn may
// keep nothing of a page: the caller restoring a million dialogs holds one
// page, not all of them twice over, so its heap does not jump at start-up
// by hundreds of megabytes (which the node's memory states would see).
// An error ends the pages handed so far; the count says how far it got.
func (s *Store) EachDialogs(now time.Time, max int, fn func([]DialogRecord)) (int, error) {
	if s.rc == nil {
		return 0, nil
	}
	var after uint64
	var buf []DialogRecord
	var ids idInterner
	n := 0
	for {
		resp, err := s.rc.call(&request{Op: opLoadDialogs, Now: now, After: after, Limit: dialogPage})
		if err != nil {
			return n, fmt.Errorf("load dialogs from %s: %w", s.cfg.Dir, err)
		}
		all, err := decodeJournalIDs(resp.DialogPage, buf[:0], &ids)
		if err != nil {
			return n, fmt.Errorf("load dialogs from %s: a page from the store process: %w", s.cfg.Dir, err)
		}
		buf = all
		page := all
		if max > 0 && n+len(page) > max {
			page = page[:max-n]
		}
		if len(page) > 0 {
			fn(page)
			n += len(page)
		}
		if max > 0 && n >= max || !resp.More || len(all) == 0 {
			return n, nil
		}
		after = all[len(all)-1].Key
	}
}

// How many dialogs (~100 bytes of JSON each) and history samples (at
// most 64 KiB each, base64 in JSON) one answer carries, so that it fits a
// message; variables for the tests of paging.
var (
	dialogPage  = 20_000
	historyPage = 200
)

// flush3 waits until what is queued was written, or the call timeout.
func (s *Store) flush3() error {
	deadline := time.Now().Add(s.cfg.ChildCallTimeout)
	for s.rc.pending() > 0 || s.rc.dirty() {
		if err := s.rc.flush(); err != nil {
			return fmt.Errorf("flush to %s: %w", s.cfg.Dir, err)
		}
		if !s.rc.running() {
			return fmt.Errorf("flush to %s: %w", s.cfg.Dir, errChildDown)
		}
		time.Sleep(time.Millisecond) // another write under way
		if time.Now().After(deadline) {
			return fmt.Errorf("flush to %s: still %d records queued", s.cfg.Dir, s.rc.pending())
		}
	}
	return nil
}

// shutdown3 stops the store process after writing what is queued; it
// returns within twice the call timeout whatever the disk does.
func (s *Store) shutdown3() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*s.cfg.ChildCallTimeout)
	defer cancel()
	return s.rc.close(ctx)
}

// writeThrough writes what is queued now, for changes an operator makes:
// the error wraps ErrUnwritable when the store process cannot take it
// (the change stays queued and is written when it can).
func (s *Store) writeThrough(what string) error {
	if err := s.flush3(); err != nil {
		return fmt.Errorf("save %s to %s: %w: %v", what, s.cfg.Dir, ErrUnwritable, err)
	}
	return nil
}
