package persist

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
)

// FormatVersion is the layout of keys and values this package writes. It is
// stored under the key "meta/format" when a store is created and checked at
// every open; a store with another version is not read.
const FormatVersion = 1

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

// ErrLocked reports that another process holds the data directory open.
// A directory can be open read-write in one process only.
var ErrLocked = errors.New("data directory is in use by another process")

// ErrCorrupt reports a store that cannot be decoded: an unknown format
// version, a record that does not parse, or a key this version does not know.
var ErrCorrupt = errors.New("store cannot be decoded")

// ErrNoStore reports that a read-only open found no store in the directory.
var ErrNoStore = errors.New("no store in directory")

// ErrClosed is returned by operations on a closed Store.
var ErrClosed = errors.New("store closed")

// resetHint tells an operator how to recover from a store that cannot be opened.
const resetHint = "to start over with an empty store, run with -data-reset " +
	"(learned rates and events in that directory are lost)"

// Config configures a Store. Each field maps to one flag of `sluice run`.
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
	// A store left by a crash cannot be opened read-only by badger (its
	// write-ahead log must be replayed); it is copied to a temporary
	// directory, opened there, and the copy is removed at Close.
	ReadOnly bool
	// Interval is how often a Saver saves the learned MOP states. At most
	// one interval of learning is lost on kill -9.
	// Flag -persist-interval, default 5s.
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
	// goroutine; Append drops (and counts) events beyond it. Default 1024.
	EventsBuffer int
	// SweepInterval is how often retention is enforced, starting at Open.
	// Default 1m; negative turns the background sweep off (call
	// SweepEvents yourself).
	SweepInterval time.Duration
	// Now returns the wall time used for event times and retention; nil
	// means time.Now. Tests inject a clock here.
	Now func() time.Time
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
	if c.Now == nil {
		c.Now = time.Now
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
	case c.Reset && c.ReadOnly:
		return errors.New("-data-reset cannot be used on a read-only store")
	}
	return nil
}

// Store is an open data directory. All methods are safe for concurrent use.
// Close stops the Savers still running (each saves a last time) before it
// closes the database; operations after Close return ErrClosed.
type Store struct {
	cfg    Config
	log    *slog.Logger
	db     *badger.DB
	tmpDir string // a read-only open of a crashed store reads a copy here

	events     chan eventReq
	quit       chan struct{} // closed by Close: background goroutines stop
	writerDone chan struct{} // closed when the event writer has drained and exited
	wg         sync.WaitGroup
	seq        uint64        // next event sequence number; writer goroutine only
	dropped    atomic.Uint64 // events not stored; see EventsDropped

	// dbMu guards dbClosed: operations hold it for reading while they use
	// db, Close for writing while it closes db.
	dbMu     sync.RWMutex
	dbClosed bool

	mu     sync.Mutex
	savers map[*Saver]struct{}
	closed bool

	closeOnce sync.Once
	closeErr  error
}

// Open opens (or creates) the store in cfg.Dir.
//
// A store written by another format version, or holding a record that does
// not decode, is not opened: the error wraps ErrCorrupt, names the directory
// and says to start with -data-reset; nothing is ever wiped unless
// cfg.Reset is set. A directory held by another process gives an error
// wrapping ErrLocked. Badger is opened with small-memory options (about
// 1.5 MB of Go heap instead of ~88 MB) and logs through logger at WARN and
// above.
func Open(cfg Config, logger *slog.Logger) (*Store, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	log := logger.With("component", "persist")
	dir := cfg.Dir

	if cfg.ReadOnly {
		if _, err := os.Stat(filepath.Join(dir, badger.ManifestFilename)); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("open store %s: %w", dir, ErrNoStore)
			}
			return nil, fmt.Errorf("open store %s: %w", dir, err)
		}
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create data directory %s: %w", dir, err)
	}

	release, err := lockDir(dir, cfg.ReadOnly)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", dir, err)
	}
	if cfg.Reset {
		n, err := wipe(dir)
		if err != nil {
			release()
			return nil, fmt.Errorf("reset store %s: %w", dir, err)
		}
		log.Warn("data directory reset: learned rates and events discarded", "dir", dir, "files_removed", n)
	}
	if err := checkManifest(dir); err != nil {
		release()
		return nil, fmt.Errorf("open store %s: %w: %w; %s", dir, ErrCorrupt, err, resetHint)
	}
	// Badger takes its own flock; ours must be gone first. A process that
	// grabs the directory in between makes badger.Open fail, which is fine.
	release()

	start := time.Now()
	var db *badger.DB
	var tmpDir string
	if cfg.ReadOnly && hasWAL(dir) {
		// A store left by a crash needs its write-ahead log replayed,
		// which badger does only read-write (read-only it fails with
		// ErrTruncateNeeded, and leaks goroutines doing so). Read a
		// copy instead of touching the store.
		db, tmpDir, err = openCopy(dir, log)
	} else {
		db, err = openBadger(dir, cfg.ReadOnly, log)
	}
	if err != nil {
		if release, lerr := lockDir(dir, cfg.ReadOnly); errors.Is(lerr, ErrLocked) {
			return nil, fmt.Errorf("open store %s: %w", dir, ErrLocked)
		} else if lerr == nil {
			release()
		}
		return nil, fmt.Errorf("open store %s: %w; %s", dir, err, resetHint)
	}
	s := &Store{
		cfg:        cfg,
		log:        log,
		db:         db,
		tmpDir:     tmpDir,
		quit:       make(chan struct{}),
		writerDone: make(chan struct{}),
		savers:     make(map[*Saver]struct{}),
	}
	if err := s.checkFormat(); err != nil {
		db.Close()
		s.removeTmp()
		return nil, err
	}
	log.Debug("store opened", "dir", dir, "read_only", cfg.ReadOnly, "took", time.Since(start))
	if !cfg.ReadOnly {
		s.events = make(chan eventReq, cfg.EventsBuffer)
		s.wg.Add(1)
		go s.writeEvents()
		if cfg.SweepInterval > 0 {
			s.wg.Add(1)
			go s.sweepLoop()
		}
	}
	return s, nil
}

// badgerOptions are the small-memory options of notes/libraries.md §3:
// a 1 MiB memtable instead of 64 MiB keeps ~88 MB off the Go heap (which
// would otherwise count against GOMEMLIMIT and distort the node memory
// state), and ValueThreshold must shrink with it or Open fails.
func badgerOptions(dir string, readOnly bool, log *slog.Logger) badger.Options {
	return badger.DefaultOptions(dir).
		WithLogger(badgerLogger{log}).
		WithReadOnly(readOnly).
		WithMemTableSize(1 << 20).WithNumMemtables(1).
		WithNumLevelZeroTables(1).WithNumLevelZeroTablesStall(2).
		WithValueLogFileSize(1 << 20).
		WithValueThreshold(1 << 10).
		WithBlockCacheSize(0).WithCompression(options.None).
		WithIndexCacheSize(0).WithBaseTableSize(256 << 10).WithBaseLevelSize(1 << 20).
		WithNumCompactors(2).
		WithNumGoroutines(1).WithMetricsEnabled(false).WithDetectConflicts(false)
}

// openBadger opens the database, turning a panic inside badger.Open (seen
// with some damaged files) into an error.
func openBadger(dir string, readOnly bool, log *slog.Logger) (db *badger.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("badger: %v", r)
		}
	}()
	return badger.Open(badgerOptions(dir, readOnly, log))
}

// openCheckEvents is how many of the newest events Open decodes.
const openCheckEvents = 1000

// Key prefixes. See README.md for the layout.
var (
	formatKey = []byte("meta/format")
	mopPrefix = []byte("mop/")
	evPrefix  = []byte("ev/")
)

// checkFormat writes the format version into a new store, or checks it and
// decodes every record of an existing one, so that a damaged store stops
// start-up instead of failing later. Every key is checked, every learned
// state and the newest openCheckEvents events are decoded; an older event
// that does not decode is reported by Events when it is read. It also finds
// the next event sequence.
func (s *Store) checkFormat() error {
	dir := s.cfg.Dir
	corrupt := func(key []byte, err error) error {
		return fmt.Errorf("open store %s: %w: key %q: %w; %s", dir, ErrCorrupt, key, err, resetHint)
	}
	var version []byte
	haveRecords := false
	var lastSeq uint64
	// Keys only: 100k event keys take ~25ms; decoding every event value
	// would take ~270ms, so only the newest openCheckEvents are decoded.
	err := s.db.View(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.PrefetchValues = false
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			k := item.Key()
			haveRecords = true
			var derr, err error
			switch {
			case bytes.Equal(k, formatKey):
				version, err = item.ValueCopy(nil)
			case bytes.HasPrefix(k, mopPrefix):
				if _, derr = parseMOPKey(k); derr == nil {
					err = item.Value(func(v []byte) error {
						_, derr = decodeMOP(v)
						return nil
					})
				}
			case bytes.HasPrefix(k, evPrefix):
				var seq uint64
				_, seq, derr = decodeEventKey(k)
				lastSeq = max(lastSeq, seq)
			default:
				derr = errors.New("unknown key")
			}
			if err != nil {
				return fmt.Errorf("read store %s: key %q: %w", dir, k, err)
			}
			if derr != nil {
				return corrupt(bytes.Clone(k), derr)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if _, err := s.scanEvents(true, time.Time{}, openCheckEvents); err != nil {
		return fmt.Errorf("open store %s: %w; %s", dir, err, resetHint)
	}
	s.seq = lastSeq + 1
	switch {
	case version == nil && haveRecords:
		return corrupt(formatKey, errors.New("missing, but the store holds records"))
	case version == nil && s.cfg.ReadOnly:
		return nil
	case version == nil:
		err := s.db.Update(func(txn *badger.Txn) error {
			return txn.Set(formatKey, []byte(strconv.Itoa(FormatVersion)))
		})
		if err == nil {
			err = s.db.Sync()
		}
		if err != nil {
			return fmt.Errorf("write format version to %s: %w", dir, err)
		}
		return nil
	}
	if v, err := strconv.Atoi(string(version)); err != nil || v != FormatVersion {
		return corrupt(formatKey, fmt.Errorf("version %q, this sluice reads version %d", version, FormatVersion))
	}
	return nil
}

// Dir returns the data directory.
func (s *Store) Dir() string { return s.cfg.Dir }

// Close stops running Savers (each saves once more), writes the events
// still queued, stops the sweep and closes the database. Calls after the
// first return the first result.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		savers := make([]*Saver, 0, len(s.savers))
		for sv := range s.savers {
			savers = append(savers, sv)
		}
		s.mu.Unlock()
		var errs []error
		for _, sv := range savers {
			if err := sv.Close(); err != nil {
				errs = append(errs, err)
			}
		}
		close(s.quit)
		s.wg.Wait()
		s.dbMu.Lock()
		s.dbClosed = true
		if err := s.db.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close store %s: %w", s.cfg.Dir, err))
		}
		s.dbMu.Unlock()
		s.removeTmp()
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// acquire makes db usable until the returned release is called, or
// reports ErrClosed once Close has closed it.
func (s *Store) acquire() (release func(), err error) {
	s.dbMu.RLock()
	if s.dbClosed {
		s.dbMu.RUnlock()
		return nil, ErrClosed
	}
	return s.dbMu.RUnlock, nil
}

// isClosed reports whether Close has begun.
func (s *Store) isClosed() bool {
	select {
	case <-s.quit:
		return true
	default:
		return false
	}
}

// hasWAL reports whether dir holds a memtable write-ahead log (*.mem),
// which a clean Close flushes and removes.
func hasWAL(dir string) bool {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".mem") {
			return true
		}
	}
	return false
}

// openCopy copies the store in dir to a temporary directory, holding a
// shared lock on dir meanwhile, and opens the copy read-write so that
// badger replays its write-ahead log there.
func openCopy(dir string, log *slog.Logger) (*badger.DB, string, error) {
	release, err := lockDir(dir, true)
	if err != nil {
		return nil, "", err
	}
	defer release()
	tmp, err := os.MkdirTemp("", "sluice-store-copy-")
	if err != nil {
		return nil, "", fmt.Errorf("copy store: %w", err)
	}
	entries, err := os.ReadDir(dir)
	for i := 0; err == nil && i < len(entries); i++ {
		if n := entries[i].Name(); n != "LOCK" && entries[i].Type().IsRegular() && isStoreFile(n) {
			err = copyFile(filepath.Join(dir, n), filepath.Join(tmp, n))
		}
	}
	var db *badger.DB
	if err == nil {
		db, err = openBadger(tmp, false, log)
	}
	if err != nil {
		os.RemoveAll(tmp)
		return nil, "", fmt.Errorf("copy store to %s: %w", tmp, err)
	}
	return db, tmp, nil
}

func copyFile(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

// removeTmp deletes the copy made by openCopy, if any.
func (s *Store) removeTmp() {
	if s.tmpDir != "" {
		if err := os.RemoveAll(s.tmpDir); err != nil {
			s.log.Warn("removing temporary copy of the store failed", "dir", s.tmpDir, "err", err)
		}
	}
}

// checkManifest refuses a directory that holds store files but no
// MANIFEST: badger would start a new manifest and delete the tables it does
// not list, losing the data without a word.
func checkManifest(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, badger.ManifestFilename)); !errors.Is(err, os.ErrNotExist) {
		return nil // present, or unreadable: badger.Open will say
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if n := e.Name(); n != "LOCK" && isStoreFile(n) {
			return fmt.Errorf("%s is missing but %s exists", badger.ManifestFilename, n)
		}
	}
	return nil
}

// AffinityKeyFile is the name of the affinity key in the data directory
// (the default of -affinity-key-file). A reset keeps it: sticky cookies and
// SIP dialogs issued before the reset stay valid.
const AffinityKeyFile = "affinity.key"

// wipe removes the files of a store from dir and returns how many; the
// affinity key stays. It refuses, removing nothing, when dir holds anything
// else that is not a badger file, so that a mistyped -data-dir never
// deletes unrelated data.
func wipe(dir string) (int, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var remove []string
	for _, e := range entries {
		if e.Name() == AffinityKeyFile && e.Type().IsRegular() {
			continue
		}
		if e.IsDir() || !isStoreFile(e.Name()) {
			return 0, fmt.Errorf("%s is not part of a store; remove it by hand or choose another -data-dir",
				filepath.Join(dir, e.Name()))
		}
		remove = append(remove, e.Name())
	}
	for i, n := range remove {
		if err := os.Remove(filepath.Join(dir, n)); err != nil {
			return i, err
		}
	}
	return len(remove), nil
}

// isStoreFile reports whether name is a file badger creates.
func isStoreFile(name string) bool {
	switch name {
	case "LOCK", "MANIFEST", "MANIFEST-REWRITE", "KEYREGISTRY", "REWRITE-KEYREGISTRY", "DISCARD":
		return true
	}
	stem, ext, ok := strings.Cut(name, ".")
	if !ok || stem == "" {
		return false
	}
	if _, err := strconv.ParseUint(stem, 10, 64); err != nil {
		return false
	}
	ext, _, _ = strings.Cut(ext, ".") // e.g. a temporary "000007.sst.tmp"
	return ext == "sst" || ext == "vlog" || ext == "mem"
}

// badgerLogger sends badger's messages to slog: errors and warnings as
// such, everything else at DEBUG.
type badgerLogger struct{ l *slog.Logger }

func (b badgerLogger) Errorf(f string, a ...any)   { b.emit(slog.LevelError, f, a) }
func (b badgerLogger) Warningf(f string, a ...any) { b.emit(slog.LevelWarn, f, a) }
func (b badgerLogger) Infof(f string, a ...any)    { b.emit(slog.LevelDebug, f, a) }
func (b badgerLogger) Debugf(f string, a ...any)   { b.emit(slog.LevelDebug, f, a) }

func (b badgerLogger) emit(level slog.Level, f string, a []any) {
	if !b.l.Enabled(context.Background(), level) {
		return
	}
	b.l.Log(context.Background(), level, "badger", "detail", strings.TrimSpace(fmt.Sprintf(f, a...)))
}
