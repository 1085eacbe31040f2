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

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"

	"github.com/sluicelb/sluice/admission"
)

// Format 1 stores were Badger databases. They are read once, to migrate
// them to format 2 (see README.md); nothing writes to Badger any more.

// badgerDir is where a migrated Badger store's files are moved, inside
// the data directory, so that an operator can check the migration and
// remove them (or move them back to run an older sluice).
const badgerDir = "badger-v1"

// Keys of format 1.
var (
	formatKey = []byte("meta/format")
	mopPrefix = []byte("mop/")
	evPrefix  = []byte("ev/")
)

// badgerOptions are the small-memory options of the store (a 4 MiB
// memtable instead of 64 MiB keeps ~80 MB off the store process's heap).
// 4 MiB rather than the 1 MiB of before: under a SIP call load (a
// journalled dialog record and its delete per call) a 1 MiB memtable
// filled every second or two, and building its level-0 table (large,
// zeroed allocations) took a fifth of the store process's CPU; at 4 MiB
// sluice spends 0.88x the CPU per call (store process included).
func badgerOptions(dir string, readOnly bool, log *slog.Logger) badger.Options {
	return badger.DefaultOptions(dir).
		WithLogger(badgerLogger{log}).
		WithReadOnly(readOnly).
		WithMemTableSize(4 << 20).WithNumMemtables(1).
		WithNumLevelZeroTables(1).WithNumLevelZeroTablesStall(2).
		WithValueLogFileSize(1 << 20).
		WithValueThreshold(1 << 10).
		WithBlockCacheSize(0).WithCompression(options.None).
		WithIndexCacheSize(0).WithBaseTableSize(256 << 10).WithBaseLevelSize(1 << 20).
		WithNumCompactors(2).
		WithNumGoroutines(1).WithMetricsEnabled(false).WithDetectConflicts(false)
}

// openBadger opens a database, turning a panic inside badger.Open (seen
// with some damaged files) into an error.
func openBadger(dir string, readOnly bool, log *slog.Logger) (db *badger.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("badger: %v", r)
		}
	}()
	return badger.Open(badgerOptions(dir, readOnly, log))
}

// isBadgerFile reports whether name is a file Badger creates.
func isBadgerFile(name string) bool {
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

// badgerFiles lists the Badger files in dir other than LOCK (which a
// clean close leaves behind and which holds no data).
func badgerFiles(entries []os.DirEntry) []string {
	var out []string
	for _, e := range entries {
		if n := e.Name(); n != "LOCK" && e.Type().IsRegular() && isBadgerFile(n) {
			out = append(out, n)
		}
	}
	return out
}

// v1Store is what a format 1 store holds.
type v1Store struct {
	states map[string]admission.MOPState
	events []record
}

// readBadger reads a whole format 1 store from dir without writing to
// it: read-only, or from a copy when a crash left a write-ahead log that
// Badger must replay. Every record is decoded; one that does not decode
// gives an error wrapping ErrCorrupt.
func readBadger(dir string, log *slog.Logger) (*v1Store, error) {
	if err := checkManifest(dir); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	var db *badger.DB
	var err error
	if hasWAL(dir) {
		var tmp string
		db, tmp, err = openCopy(dir, log)
		if tmp != "" {
			defer os.RemoveAll(tmp)
		}
	} else {
		db, err = openBadger(dir, true, log)
	}
	if err != nil {
		return nil, err
	}
	defer db.Close()
	out := &v1Store{states: map[string]admission.MOPState{}}
	var version []byte
	err = db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.DefaultIteratorOptions)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			k := item.KeyCopy(nil)
			v, err := item.ValueCopy(nil)
			if err != nil {
				return fmt.Errorf("key %q: %w", k, err)
			}
			var derr error
			switch {
			case bytes.Equal(k, formatKey):
				version = v
			case bytes.HasPrefix(k, mopPrefix):
				var key string
				if key, derr = parseMOPKey(k); derr == nil {
					out.states[key], derr = decodeMOP(v)
				}
			case bytes.HasPrefix(k, evPrefix):
				var seq uint64
				if _, seq, derr = decodeEventKey(k); derr == nil {
					var ev admission.Event
					if ev, derr = decodeEvent(v); derr == nil {
						out.events = append(out.events, record{Seq: seq + 1, Event: ev})
					}
				}
			default:
				derr = errors.New("unknown key")
			}
			if derr != nil {
				return fmt.Errorf("%w: key %q: %w", ErrCorrupt, k, derr)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if version == nil && (len(out.states) > 0 || len(out.events) > 0) {
		return nil, fmt.Errorf("%w: key %q missing, but the store holds records", ErrCorrupt, formatKey)
	}
	if version != nil && string(version) != "1" {
		return nil, fmt.Errorf("%w: key %q: version %q, this sluice reads versions 1 and %d", ErrCorrupt, formatKey, version, FormatVersion)
	}
	return out, nil
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

// openCopy copies the Badger store in dir to a temporary directory and
// opens the copy read-write, so that Badger replays its write-ahead log
// there and the store itself is not touched.
func openCopy(dir string, log *slog.Logger) (*badger.DB, string, error) {
	tmp, err := os.MkdirTemp("", "sluice-store-copy-")
	if err != nil {
		return nil, "", fmt.Errorf("copy store: %w", err)
	}
	entries, err := os.ReadDir(dir)
	for i := 0; err == nil && i < len(entries); i++ {
		if n := entries[i].Name(); n != "LOCK" && entries[i].Type().IsRegular() && isBadgerFile(n) {
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

// checkManifest refuses Badger files without a MANIFEST: Badger would
// start a new manifest and delete the tables it does not list.
func checkManifest(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, badger.ManifestFilename)); !errors.Is(err, os.ErrNotExist) {
		return nil // present, or unreadable: badger.Open will say
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if files := badgerFiles(entries); len(files) > 0 {
		return fmt.Errorf("%s is missing but %s exists", badger.ManifestFilename, files[0])
	}
	return nil
}

// badgerLogger sends Badger's messages to slog: errors and warnings as
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
