package persist

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// FormatVersion is the layout of the files this package writes (see
// README.md). It is stored in the file "format" when a store is created
// and checked at every open. Version 1 stores (Badger databases) are
// migrated at open.
const FormatVersion = 2

// DefaultDir is the default data directory (flag -data-dir).
const DefaultDir = "./sluice-data"

// Defaults of Config.
const (
	DefaultInterval        = 5 * time.Second
	DefaultEventsRetention = 7 * 24 * time.Hour
	DefaultEventsMax       = 100_000
	DefaultEventsBuffer    = 1024
	DefaultSweepInterval   = time.Minute
)

// Files of a store.
const (
	formatFile    = "format"
	mopFile       = "mop.json"
	overridesFile = "overrides.json"
)

// clusterFile: see cluster.go.

// ErrLocked reports that another process holds the data directory open.
// A directory can be open read-write in one process only.
var ErrLocked = errors.New("data directory is in use by another process")

// ErrCorrupt reports a store that cannot be decoded: an unknown format
// version, a record that does not parse, or a file this version does not
// know.
var ErrCorrupt = errors.New("store cannot be decoded")

// ErrNoStore reports that a read-only open found no store in the directory.
var ErrNoStore = errors.New("no store in directory")

// ErrClosed is returned by operations on a closed Store.
var ErrClosed = errors.New("store closed")

// ErrUnwritable wraps the error of a write that failed because of the
// data directory (missing, read-only, full, I/O error). Such failures are
// reported by Health and logged by the store itself, rate-limited.
var ErrUnwritable = errors.New("data directory cannot be written")

// Skipped is what a read-only store left out, unreadable: whole lines of
// event segments that do not decode, and files (segments, learned rates,
// overrides) that are not regular files, too large, or do not decode.
type Skipped struct {
	Lines int
	Files int
}

// Skipped returns what a read-only open left out; a read-write open
// refuses such a store instead, so its count is zero.
func (s *Store) Skipped() Skipped { return s.skipped }

// resetHint tells an operator how to recover from a store that cannot be opened.
const resetHint = "to start over with an empty store, run with -data-reset " +
	"(learned rates and events in that directory are lost)"

// Config configures a Store. Each exported field but Now maps to one flag
// of `sluice run`.
type Config struct {
	// Dir is the data directory; it is created if missing (mode 0700).
	// Flag -data-dir, default "./sluice-data".
	Dir string
	// Reset wipes the store in Dir before opening it, losing learned rates
	// and events; the wipe is logged at WARN. It is refused when another
	// process holds the directory or when the directory holds files that are
	// not part of a store. Flag -data-reset, default false.
	Reset bool
	// ReadOnly opens an existing store for reading with a shared lock, as
	// `sluice events` does: nothing is written, Append drops events and no
	// sweep runs. It fails with ErrLocked while a sluice has the store open.
	// A format 1 (Badger) store is migrated into a temporary directory,
	// read there, and the copy is removed at Close.
	ReadOnly bool
	// Interval is how often a Saver saves the learned MOP states, and how
	// often writes that failed are retried. At most one interval of
	// learning is lost on kill -9. Flag -persist-interval, default 5s.
	Interval time.Duration
	// EventsRetention is how long events are kept; older ones are deleted
	// by the sweep. Negative keeps events regardless of age.
	// Flag -events-retention, default 168h (7 days).
	EventsRetention time.Duration
	// EventsMax is the largest number of events kept; the sweep deletes the
	// oldest beyond it. Negative means no limit by count.
	// Flag -events-max, default 100000.
	EventsMax int
	// EventsBuffer is how many appended events may wait for the writer
	// goroutine; Append drops (and counts) events beyond it. While the disk
	// cannot take them, up to 4×EventsBuffer written-off events wait in
	// memory (the oldest are dropped beyond that). Default 1024.
	EventsBuffer int
	// SweepInterval is how often retention is enforced, starting at Open.
	// Default 1m; negative turns the background sweep off (call
	// SweepEvents yourself).
	SweepInterval time.Duration
	// FaultLogInterval is how often a store that keeps failing to write
	// logs a count of its failures; the first failure and the recovery
	// are logged at once. Default 5m.
	FaultLogInterval time.Duration
	// Now returns the wall time used for event times, retention and fault
	// reports; nil means time.Now. Tests inject a clock here.
	Now func() time.Time

	// Child, when set, makes the store format 3: a Badger database owned
	// by a store process this command runs (see README.md), spoken to over
	// a socketpair. Nil keeps the format 2 files in this process (tools,
	// tests, and platforms without the store process).
	Child ChildCommand
	// ChildStartTimeout bounds the wait at Open for the store process to
	// answer and the stored state to load; past it the balancer starts on
	// defaults (logged at ERROR) and the state loads when the process
	// answers. Default 10s.
	ChildStartTimeout time.Duration
	// ChildCallTimeout bounds one request to the store process; one that
	// does not answer in time is killed and restarted. Default 5s.
	ChildCallTimeout time.Duration
	// QueueMax bounds each queue of records waiting for the store process
	// (events, history samples, dialogs); beyond it the oldest are dropped
	// and counted. Default 8192.
	QueueMax int
	// HistoryRetention is how long dashboard history samples are kept
	// (flag -history-retention). Default 24h.
	HistoryRetention time.Duration

	// childMinBackoff and childMaxBackoff bound the restart backoff of the
	// store process (1s doubling to 1m); tests shorten them.
	childMinBackoff, childMaxBackoff time.Duration

	// fs is where files are written; nil means the operating system.
	// Tests inject failures here.
	fs fileSystem
}

func (c *Config) setDefaults() {
	if c.Dir == "" {
		c.Dir = DefaultDir
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.EventsRetention == 0 {
		c.EventsRetention = DefaultEventsRetention
	}
	if c.EventsMax == 0 {
		c.EventsMax = DefaultEventsMax
	}
	if c.EventsBuffer == 0 {
		c.EventsBuffer = DefaultEventsBuffer
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = DefaultSweepInterval
	}
	if c.FaultLogInterval == 0 {
		c.FaultLogInterval = DefaultFaultLogInterval
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.fs == nil {
		c.fs = osFS{}
	}
	if c.ChildStartTimeout == 0 {
		c.ChildStartTimeout = DefaultChildStartTimeout
	}
	if c.ChildCallTimeout == 0 {
		c.ChildCallTimeout = DefaultChildCallTimeout
	}
	if c.QueueMax == 0 {
		c.QueueMax = DefaultQueueMax
	}
	if c.HistoryRetention == 0 {
		c.HistoryRetention = DefaultHistoryRetention
	}
}

// Validate reports the first invalid field, naming its flag. It is called
// by Open after defaults are filled in.
func (c Config) Validate() error {
	switch {
	case c.Interval < 10*time.Millisecond:
		return errors.New("-persist-interval must be at least 10ms")
	case c.EventsBuffer < 0:
		return errors.New("events buffer must not be negative")
	case c.HistoryRetention < 0:
		return fmt.Errorf("-history-retention %v: must be positive", c.HistoryRetention)
	case c.QueueMax < 0:
		return fmt.Errorf("store queue size %d: must not be negative", c.QueueMax)
	case c.ChildStartTimeout < 0 || c.ChildCallTimeout < 0:
		return errors.New("store process timeouts must not be negative")
	case c.Reset && c.ReadOnly:
		return errors.New("-data-reset cannot be used on a read-only store")
	}
	return nil
}

// Store is an open data directory. All methods are safe for concurrent use.
// Close stops the Savers still running (each saves a last time) before it
// releases the directory; operations after Close return ErrClosed.
//
// A store never stops the balancer because of its disk: a write that
// fails (directory removed, read-only, full, I/O error) is counted,
// logged once and reported by Health; learned states and events stay in
// memory and are written when the directory takes writes again. Close
// returns by its context's deadline even when the disk does not answer.
type Store struct {
	cfg    Config
	log    *slog.Logger
	fs     fileSystem
	dir    string // where files are read and written: cfg.Dir, or tmpDir
	tmpDir string // a read-only open of a format 1 store reads a migrated copy here
	unlock func() // releases the directory lock

	// mopMu guards mop, the learned states as last saved or loaded;
	// mopWrite serialises writes of mopFile (it may be held by a write
	// the disk never finishes, mopMu never is).
	mopMu    sync.Mutex
	mop      map[string]admission.MOPState
	mopWrite sync.Mutex
	// formatMu serialises ensureFormat's check and write of formatFile.
	formatMu sync.Mutex

	// ovMu guards overrides, the operator's run-time changes (overrides.go),
	// and clusterNodes, the cluster's last node count (cluster.go).
	ovMu         sync.Mutex
	overrides    []Override
	clusterNodes int64

	events     chan eventReq
	quit       chan struct{} // closed by Close: background goroutines stop
	writerDone chan struct{} // closed when the event writer has drained and exited
	wg         sync.WaitGroup
	dropped    atomic.Uint64 // events not stored; see EventsDropped
	// skipped counts what a read-only open left out because it could not
	// be read (see Skipped); set by Open, then only read.
	skipped Skipped

	// segMu guards the event segment index and the events waiting in
	// memory; the writer goroutine is the only one to change them.
	segMu   sync.RWMutex
	segs    []*segment
	pending []record
	ew      eventWriter // writer goroutine only

	health health

	mu     sync.Mutex
	savers map[*Saver]struct{}
	closed bool // Close has begun
	shut   atomic.Bool

	// rc is the store process of a format 3 store, nil for format 2.
	rc *remote
	// ro is a format 3 database opened read-only in this process
	// (`sluice events` on a stopped sluice), nil otherwise.
	ro *kv3

	closeOnce sync.Once
	closeDone chan struct{}
	closeErr  error
}

// Open opens (or creates) the store in cfg.Dir.
//
// A store written by another format version, or holding a record that does
// not decode, is not opened: the error wraps ErrCorrupt, names the directory
// and says to start with -data-reset; nothing is ever wiped unless
// cfg.Reset is set. A directory held by another process gives an error
// wrapping ErrLocked. A format 1 (Badger) store is migrated to format 2;
// its files are moved to the subdirectory badger-v1.
func Open(cfg Config, logger *slog.Logger) (*Store, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	log := logger.With("component", "persist")
	if cfg.Child != nil && !cfg.ReadOnly {
		return openFormat3(cfg, log)
	}
	dir := cfg.Dir

	if cfg.ReadOnly {
		if fi, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("open store %s: %w", dir, ErrNoStore)
		} else if err != nil {
			return nil, fmt.Errorf("open store %s: %w", dir, err)
		} else if !fi.IsDir() {
			return nil, fmt.Errorf("open store %s: not a directory", dir)
		}
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create data directory %s: %w", dir, err)
	}
	unlock, err := lockDir(dir, cfg.ReadOnly)
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
	start := time.Now()
	if cfg.ReadOnly && isFormat3(dir) {
		if err := s.openReadOnly3(); err != nil {
			s.unlock()
			s.removeTmp()
			return nil, err
		}
		return s, nil
	}
	if err := s.open(); err != nil {
		s.unlock() // migrate may have taken the lock anew
		s.removeTmp()
		return nil, err
	}
	log.Debug("store opened", "dir", dir, "read_only", cfg.ReadOnly, "events", s.eventCount(), "took", time.Since(start))
	if !cfg.ReadOnly {
		s.events = make(chan eventReq, cfg.EventsBuffer)
		s.wg.Add(1)
		go s.writeEvents()
	}
	return s, nil
}

// open resets, migrates and loads the store; the directory is locked.
func (s *Store) open() error {
	dir := s.cfg.Dir
	if s.cfg.Reset {
		n, err := wipe(dir)
		if err != nil {
			return fmt.Errorf("reset store %s: %w", dir, err)
		}
		s.log.Warn("data directory reset: learned rates and events discarded", "dir", dir, "files_removed", n)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("open store %s: %w", dir, err)
	}
	_, statErr := os.Stat(filepath.Join(dir, formatFile))
	hasFormat := statErr == nil
	if old := badgerFiles(entries); len(old) > 0 {
		if err := s.migrate(hasFormat); err != nil {
			return err
		}
	}
	if err := s.load(); err != nil {
		return err
	}
	return nil
}

// migrate turns the format 1 (Badger) store in the data directory into a
// format 2 one. Read-write, it writes the new files next to the old ones,
// the format file last, and then moves the old files into badger-v1; a
// failure before the format file is written leaves the old store as it
// was, and the next open tries again. Read-only, it writes the new store
// into a temporary directory and reads that.
func (s *Store) migrate(hasFormat bool) error {
	dir := s.cfg.Dir
	if hasFormat {
		// Migrated, but the move of the old files was cut short.
		return s.moveBadgerFiles()
	}
	// Badger takes its own lock on the directory; ours must be released
	// meanwhile. A process that takes the directory in between makes the
	// read fail, which is fine.
	s.unlock()
	v1, err := readBadger(dir, s.log)
	unlock, lerr := lockDir(dir, s.cfg.ReadOnly)
	if lerr != nil {
		s.unlock = func() {}
		return fmt.Errorf("open store %s: %w", dir, lerr)
	}
	s.unlock = unlock
	if err != nil && s.cfg.ReadOnly {
		return fmt.Errorf("open store %s: format 1 (Badger) store: %w", dir, err)
	}
	if err != nil {
		return fmt.Errorf("open store %s: format 1 (Badger) store: %w; %s", dir, err, resetHint)
	}
	to := dir
	if s.cfg.ReadOnly {
		if to, err = os.MkdirTemp("", "sluice-store-v2-"); err != nil {
			return fmt.Errorf("open store %s: migrate to a temporary directory: %w", dir, err)
		}
		s.tmpDir, s.dir = to, to
	} else if err := removeV2Files(dir); err != nil {
		return fmt.Errorf("migrate store %s: remove the files of an unfinished migration: %w", dir, err)
	}
	if err := writeV2(s.fs, to, v1); err != nil {
		return fmt.Errorf("migrate store %s from format 1 (Badger) to %d: %w (the old store is unchanged)", dir, FormatVersion, err)
	}
	if s.cfg.ReadOnly {
		return nil
	}
	if err := s.moveBadgerFiles(); err != nil {
		return err
	}
	s.log.Warn("data directory migrated from format 1 (Badger); the old files are kept, remove them once this sluice runs well",
		"dir", dir, "learned_rates", len(v1.states), "events", len(v1.events), "old_files", filepath.Join(dir, badgerDir))
	return nil
}

// moveBadgerFiles moves the files of a migrated format 1 store into the
// subdirectory badger-v1, where nothing reads them.
func (s *Store) moveBadgerFiles() error {
	dir := s.cfg.Dir
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("open store %s: %w", dir, err)
	}
	dst := filepath.Join(dir, badgerDir)
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return fmt.Errorf("open store %s: keep the old files: %w", dir, err)
	}
	for _, e := range entries {
		if n := e.Name(); e.Type().IsRegular() && isBadgerFile(n) {
			if err := os.Rename(filepath.Join(dir, n), filepath.Join(dst, n)); err != nil {
				return fmt.Errorf("open store %s: move old file %s to %s: %w", dir, n, dst, err)
			}
		}
	}
	return nil
}

// writeV2 writes a whole store into dir: learned states, event segments,
// and the format file last, each synced.
func writeV2(fsys fileSystem, dir string, v1 *v1Store) error {
	if len(v1.states) > 0 {
		data, err := encodeMOPFile(v1.states)
		if err != nil {
			return err
		}
		if err := writeAtomic(fsys, dir, mopFile, data); err != nil {
			return err
		}
	}
	var buf []byte
	first := uint64(0)
	flush := func() error {
		if len(buf) == 0 {
			return nil
		}
		err := writeAtomic(fsys, dir, segmentName(first), buf)
		buf = buf[:0]
		return err
	}
	for _, r := range v1.events {
		line, err := encodeRecord(r)
		if err != nil {
			return err
		}
		if len(buf) == 0 {
			first = r.Seq
		}
		buf = append(buf, line...)
		if len(buf) >= segmentMax {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	return writeAtomic(fsys, dir, formatFile, []byte(strconv.Itoa(FormatVersion)+"\n"))
}

// load reads the format file, the learned states and the event index.
func (s *Store) load() error {
	dir := s.dir
	corrupt := func(file string, err error) error {
		if s.cfg.ReadOnly { // a read problem: nothing to wipe
			return fmt.Errorf("open store %s: %w: %s: %w", s.cfg.Dir, ErrCorrupt, file, err)
		}
		return fmt.Errorf("open store %s: %w: %s: %w; %s", s.cfg.Dir, ErrCorrupt, file, err, resetHint)
	}
	// skip leaves out, read-only, a file that cannot be read.
	skip := func(file string, err error) bool {
		if !s.cfg.ReadOnly || errors.Is(err, fs.ErrNotExist) {
			return false
		}
		s.skipped.Files++
		s.log.Warn("unreadable file of the store left out", "dir", s.cfg.Dir, "file", file, "err", err)
		return true
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("open store %s: %w", s.cfg.Dir, err)
	}
	var haveRecords bool
	var segNames []string
	for _, e := range entries {
		n := e.Name()
		switch {
		case n == formatFile || n == AffinityKeyFile || n == badgerDir || n == "LOCK":
		case strings.HasSuffix(n, tmpSuffix) && isStoreFile(strings.TrimSuffix(n, tmpSuffix)):
			// An atomic write cut short by a crash; the file it was to
			// replace is whole.
			if !s.cfg.ReadOnly {
				if err := os.Remove(filepath.Join(dir, n)); err != nil {
					return fmt.Errorf("open store %s: remove unfinished write %s: %w", s.cfg.Dir, n, err)
				}
			}
		case n == mopFile || n == overridesFile || n == clusterFile:
			haveRecords = true
		case isSegmentName(n):
			haveRecords = true
			segNames = append(segNames, n)
		}
	}
	version, err := readStoreFile(filepath.Join(dir, formatFile))
	switch {
	case errors.Is(err, fs.ErrNotExist) && haveRecords:
		return corrupt(formatFile, errors.New("missing, but the store holds records"))
	case errors.Is(err, fs.ErrNotExist) && s.cfg.ReadOnly:
	case errors.Is(err, fs.ErrNotExist):
		if err := writeAtomic(s.fs, dir, formatFile, []byte(strconv.Itoa(FormatVersion)+"\n")); err != nil {
			return fmt.Errorf("write format version to %s: %w", s.cfg.Dir, err)
		}
	case err != nil:
		return fmt.Errorf("open store %s: %s: %w", s.cfg.Dir, formatFile, err)
	default:
		if v, err := strconv.Atoi(strings.TrimSpace(string(version))); err != nil || v != FormatVersion {
			return corrupt(formatFile, fmt.Errorf("version %q, this sluice reads version %d", strings.TrimSpace(string(version)), FormatVersion))
		}
	}
	if data, err := readStoreFile(filepath.Join(dir, mopFile)); err == nil {
		states, err := decodeMOPFile(data)
		switch {
		case err == nil:
			s.mop = states
		case !skip(mopFile, err):
			return corrupt(mopFile, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) && !skip(mopFile, err) {
		return fmt.Errorf("open store %s: %w", s.cfg.Dir, err)
	}
	if data, err := readStoreFile(filepath.Join(dir, clusterFile)); err == nil {
		n, err := decodeCluster(data)
		switch {
		case err == nil:
			s.clusterNodes = n
		case !skip(clusterFile, err):
			return corrupt(clusterFile, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) && !skip(clusterFile, err) {
		return fmt.Errorf("open store %s: %w", s.cfg.Dir, err)
	}
	if data, err := readStoreFile(filepath.Join(dir, overridesFile)); err == nil {
		ovs, err := decodeOverrides(data)
		switch {
		case err == nil:
			s.overrides = ovs
		case !skip(overridesFile, err):
			return corrupt(overridesFile, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) && !skip(overridesFile, err) {
		return fmt.Errorf("open store %s: %w", s.cfg.Dir, err)
	}
	var next uint64 = 1
	for _, n := range segNames {
		seg, err := s.scanSegment(n)
		if err != nil && skip(n, err) {
			continue
		}
		if err != nil {
			if errors.Is(err, ErrCorrupt) {
				return fmt.Errorf("open store %s: %w; %s", s.cfg.Dir, err, resetHint)
			}
			return fmt.Errorf("open store %s: %w", s.cfg.Dir, err)
		}
		s.segs = append(s.segs, seg)
		next = max(next, seg.last+1, seg.first+1)
	}
	sortSegments(s.segs)
	s.ew.seq = next
	s.ew.rotate = true
	return nil
}

// Dir returns the data directory.
func (s *Store) Dir() string { return s.cfg.Dir }

// Close stops running Savers (each saves once more), writes the events
// still queued, stops the sweep and releases the directory. It returns
// when that is done or when ctx is done, whichever comes first: a disk
// that does not answer never holds up shutdown (the goroutines left
// waiting for it are abandoned; the process is about to exit). Calls
// after the first wait for the same work and return its result.
func (s *Store) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		go func() {
			s.closeErr = s.shutdown()
			close(s.closeDone)
		}()
	})
	select {
	case <-s.closeDone:
		return s.closeErr
	case <-ctx.Done():
		if s.rc != nil {
			// The store process did not finish in time (stuck on its
			// disk, or stopped): it gets no SIGKILL when this process
			// exits, so it is killed now.
			s.rc.killChild()
		}
		return fmt.Errorf("close store %s: %w: the disk did not finish the last writes; learned rates and events since the last successful save may be lost",
			s.cfg.Dir, ctx.Err())
	}
}

func (s *Store) shutdown() error {
	s.mu.Lock()
	s.closed = true
	savers := make([]*Saver, 0, len(s.savers))
	for sv := range s.savers {
		savers = append(savers, sv)
	}
	s.mu.Unlock()
	var errs []error
	for _, sv := range savers {
		if err := sv.Close(context.Background()); err != nil {
			errs = append(errs, err)
		}
	}
	close(s.quit)
	s.wg.Wait()
	if s.rc != nil {
		if err := s.shutdown3(); err != nil {
			errs = append(errs, fmt.Errorf("close store %s: %w", s.cfg.Dir, err))
		}
	}
	if s.ro != nil {
		s.ro.db.Close()
	}
	if n := s.pendingCount(); n > 0 {
		errs = append(errs, fmt.Errorf("close store %s: %d events could not be written: %w", s.cfg.Dir, n, s.LastError()))
	}
	s.shut.Store(true)
	s.unlock()
	s.removeTmp()
	return errors.Join(errs...)
}

// checkOpen reports ErrClosed once Close has finished.
func (s *Store) checkOpen() error {
	if s.shut.Load() {
		return ErrClosed
	}
	return nil
}

// isClosed reports whether Close has begun stopping the background work.
func (s *Store) isClosed() bool {
	select {
	case <-s.quit:
		return true
	default:
		return false
	}
}

// removeTmp deletes the copy made for a read-only open, if any.
func (s *Store) removeTmp() {
	if s.tmpDir != "" {
		if err := os.RemoveAll(s.tmpDir); err != nil {
			s.log.Warn("removing temporary copy of the store failed", "dir", s.tmpDir, "err", err)
		}
	}
}

// ensureFormat writes the format file when it is missing: after the data
// directory was removed and made again while sluice ran, the first write
// that works makes it a store again.
func (s *Store) ensureFormat() error {
	// The events writer and the small files' writers call this under
	// locks of their own: without one here, both could write format.tmp
	// at once after the directory came back, one renaming the other's
	// file away (a spurious failed write, retried).
	s.formatMu.Lock()
	defer s.formatMu.Unlock()
	if _, err := s.fs.Stat(filepath.Join(s.dir, formatFile)); !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return writeAtomic(s.fs, s.dir, formatFile, []byte(strconv.Itoa(FormatVersion)+"\n"))
}

// AffinityKeyFile is the name of the affinity key in the data directory
// (the default of -affinity-key-file). A reset keeps it: sticky cookies and
// SIP dialogs issued before the reset stay valid.
const AffinityKeyFile = "affinity.key"

// wipe removes the files of a store from dir (including a format 1 store
// and the badger-v1 directory of a migrated one) and returns how many; the
// affinity key stays. It refuses, removing nothing, when dir holds
// anything else, so that a mistyped -data-dir never deletes unrelated data.
func wipe(dir string) (int, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var remove []string
	for _, e := range entries {
		n := e.Name()
		switch {
		case n == AffinityKeyFile && e.Type().IsRegular():
			continue
		case (n == db3Dir || n == v2Dir) && e.IsDir():
		case n == badgerDir && e.IsDir():
			sub, err := os.ReadDir(filepath.Join(dir, n))
			if err != nil {
				return 0, err
			}
			for _, f := range sub {
				if !f.Type().IsRegular() || !isBadgerFile(f.Name()) {
					return 0, fmt.Errorf("%s is not part of a store; remove it by hand or choose another -data-dir",
						filepath.Join(dir, n, f.Name()))
				}
			}
		case e.IsDir() || !isStoreFile(n):
			return 0, fmt.Errorf("%s is not part of a store; remove it by hand or choose another -data-dir",
				filepath.Join(dir, n))
		}
		remove = append(remove, n)
	}
	for i, n := range remove {
		if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
			return i, err
		}
	}
	return len(remove), nil
}

// removeV2Files removes format 2 files from dir: before a migration
// they can only be left by an earlier migration that did not finish.
func removeV2Files(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if n := e.Name(); e.Type().IsRegular() && isStoreFile(n) && !isBadgerFile(n) {
			if err := os.Remove(filepath.Join(dir, n)); err != nil {
				return err
			}
		}
	}
	return nil
}

// isStoreFile reports whether name is a file of a store: format 2, a
// temporary file of an atomic write, or format 1 (Badger).
func isStoreFile(name string) bool {
	name = strings.TrimSuffix(name, tmpSuffix)
	return name == formatFile || name == mopFile || name == overridesFile || name == clusterFile || isSegmentName(name) || isBadgerFile(name)
}
