package persist

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/sluicelb/sluice/admission"
)

var t0 = time.Date(2026, 11, 29, 15, 0, 0, 0, time.UTC)

// bg is the context of Close calls that have no deadline to test.
var bg = context.Background()

// openTest opens a store in dir and closes it when the test ends.
func openTest(t *testing.T, cfg Config) *Store {
	t.Helper()
	s, err := Open(cfg, nil)
	if err != nil {
		t.Fatalf("Open(%s): %v", cfg.Dir, err)
	}
	t.Cleanup(func() { s.Close(bg) })
	return s
}

func learned(rate float64) admission.MOPState {
	return admission.MOPState{
		Phase:       admission.Learned,
		LearnedRate: rate,
		AllowedRate: rate,
		Base:        0.2,
		Slope:       0.001,
		UpdatedAt:   t0,
	}
}

func sameState(a, b admission.MOPState) bool {
	return a.Phase == b.Phase && a.LearnedRate == b.LearnedRate && a.AllowedRate == b.AllowedRate &&
		a.Base == b.Base && a.Slope == b.Slope && a.UpdatedAt.Equal(b.UpdatedAt)
}

func checkStates(t *testing.T, got, want map[string]admission.MOPState) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d states %v, want %d %v", len(got), got, len(want), want)
	}
	for k, w := range want {
		if g, ok := got[k]; !ok || !sameState(g, w) {
			t.Errorf("state %q: got %+v (present %v), want %+v", k, g, ok, w)
		}
	}
}

func TestMOPRoundTripAndReopen(t *testing.T) {
	dir := t.TempDir()
	want := map[string]admission.MOPState{
		MOPKey("http", "127.0.0.1:18081"): learned(120.5),
		MOPKey("sip", "[::1]:5070"):       {Phase: admission.Discovery, AllowedRate: 12, UpdatedAt: t0},
	}
	s, err := Open(Config{Dir: dir}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.LoadMOP(); err != nil || len(got) != 0 {
		t.Fatalf("LoadMOP on a new store = %v, %v; want empty", got, err)
	}
	if err := s.SaveMOP(want); err != nil {
		t.Fatal(err)
	}
	got, err := s.LoadMOP()
	if err != nil {
		t.Fatal(err)
	}
	checkStates(t, got, want)

	// A later save of one backend keeps the other.
	want[MOPKey("http", "127.0.0.1:18081")] = learned(130)
	if err := s.Save(MOPKey("http", "127.0.0.1:18081"), learned(130)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(bg); err != nil {
		t.Fatal(err)
	}

	s = openTest(t, Config{Dir: dir})
	got, err = s.LoadMOP()
	if err != nil {
		t.Fatal(err)
	}
	checkStates(t, got, want)
}

func TestSaveMOPSkipsInvalid(t *testing.T) {
	s := openTest(t, Config{Dir: t.TempDir()})
	err := s.SaveMOP(map[string]admission.MOPState{
		"http/good:1":   learned(5),
		"http/nan:1":    {Phase: admission.Learned, LearnedRate: 3, Base: math.NaN()},
		"http/inf:1":    {AllowedRate: math.Inf(1)},
		"http/phase:1":  {Phase: 7, AllowedRate: 1},
		"noslash":       learned(1),
		"http/sp ace:1": learned(1),
	})
	if err == nil {
		t.Fatal("SaveMOP with invalid states: got nil error")
	}
	for _, k := range []string{"nan:1", "inf:1", "phase:1", "noslash", "sp ace:1"} {
		if !strings.Contains(err.Error(), k) {
			t.Errorf("error %q does not name %q", err, k)
		}
	}
	got, err := s.LoadMOP()
	if err != nil {
		t.Fatal(err)
	}
	checkStates(t, got, map[string]admission.MOPState{"http/good:1": learned(5)})
}

// writeRaw opens dir directly with badger (no format check) and sets kv.
func writeRaw(t *testing.T, dir string, kv map[string]string) {
	t.Helper()
	db, err := badger.Open(badgerOptions(dir, false, discardLogger()))
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(txn *badger.Txn) error {
		for k, v := range kv {
			if err := txn.Set([]byte(k), []byte(v)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// checkRecoverable asserts that Open fails on dir with an error that names
// the directory and -data-reset, and that Reset then opens an empty store.
func checkRecoverable(t *testing.T, dir string, want error) {
	t.Helper()
	_, err := Open(Config{Dir: dir}, nil)
	if err == nil {
		t.Fatal("Open of a damaged store: got nil error")
	}
	if want != nil && !errors.Is(err, want) {
		t.Errorf("error %q: want errors.Is %v", err, want)
	}
	if !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "-data-reset") {
		t.Errorf("error %q does not name the directory and -data-reset", err)
	}
	// Never silently wiped: a second plain Open still fails.
	if _, err := Open(Config{Dir: dir}, nil); err == nil {
		t.Fatal("second Open of a damaged store succeeded")
	}
	s := openTest(t, Config{Dir: dir, Reset: true})
	got, err := s.LoadMOP()
	if err != nil || len(got) != 0 {
		t.Fatalf("after reset LoadMOP = %v, %v; want empty", got, err)
	}
	if evs, err := s.Events(time.Time{}, 0); err != nil || len(evs) != 0 {
		t.Fatalf("after reset Events = %v, %v; want empty", evs, err)
	}
}

func TestCorruptStore(t *testing.T) {
	tests := []struct {
		name string
		kv   map[string]string
	}{
		{"unknown version", map[string]string{"meta/format": "99"}},
		{"garbage version", map[string]string{"meta/format": "x"}},
		{"records without version", map[string]string{"mop/http/a:1": `{"phase":1}`}},
		{"bad mop json", map[string]string{"meta/format": "1", "mop/http/a:1": `{"phase":1,`}},
		{"bad mop value", map[string]string{"meta/format": "1", "mop/http/a:1": `{"phase":9}`}},
		{"bad mop key", map[string]string{"meta/format": "1", "mop/nokey": `{"phase":1}`}},
		{"bad event json", map[string]string{"meta/format": "1", string(eventKey(t0, 1)): `not json`}},
		{"bad event key", map[string]string{"meta/format": "1", "ev/short": `{"time":"2026-11-29T15:00:00Z","kind":"x"}`}},
		{"unknown key", map[string]string{"meta/format": "1", "other": "x"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeRaw(t, dir, tc.kv)
			checkRecoverable(t, dir, ErrCorrupt)
		})
	}
}

// writeV2 creates a format 2 store in dir with the given files (name to
// content), format file included unless given as "".
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

const goodLine = `{"seq":1,"time":"2026-11-29T15:00:00Z","kind":"config.warning","message":"ok"}` + "\n"

func TestCorruptStoreV2(t *testing.T) {
	seg := segmentName(1)
	tests := []struct {
		name  string
		files map[string]string
	}{
		{"unknown version", map[string]string{formatFile: "99\n"}},
		{"garbage version", map[string]string{formatFile: "x"}},
		{"states without version", map[string]string{mopFile: `{}`}},
		{"events without version", map[string]string{seg: goodLine}},
		{"bad mop json", map[string]string{formatFile: "2\n", mopFile: `{"http/a:1":{"phase":1,`}},
		{"bad mop value", map[string]string{formatFile: "2\n", mopFile: `{"http/a:1":{"phase":9}}`}},
		{"bad mop key", map[string]string{formatFile: "2\n", mopFile: `{"nokey":{"phase":1}}`}},
		{"bad event line", map[string]string{formatFile: "2\n", seg: "not json\n" + goodLine}},
		{"event without seq", map[string]string{formatFile: "2\n", seg: `{"time":"2026-11-29T15:00:00Z","kind":"x","message":""}` + "\n"}},
		{"event without kind", map[string]string{formatFile: "2\n", seg: `{"seq":3,"time":"2026-11-29T15:00:00Z","message":""}` + "\n"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, tc.files)
			checkRecoverable(t, dir, ErrCorrupt)
		})
	}
}

// TestCutShortEventLineIgnored: the bytes after a segment's last newline
// are a write the disk cut short, not damage; the events before are read
// and new ones follow in a new segment.
func TestCutShortEventLineIgnored(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{formatFile: "2\n", segmentName(1): goodLine + `{"seq":2,"time":"2026-11-`})
	s := openTest(t, Config{Dir: dir, SweepInterval: -1})
	appendAll(t, s, ev(t0.Add(time.Second), "after"))
	evs, err := s.Events(time.Time{}, 0)
	checkMessages(t, "Events", evs, err, "ok", "after")
	if err := s.Close(bg); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, Config{Dir: dir, SweepInterval: -1})
	evs, err = s.Events(time.Time{}, 0)
	checkMessages(t, "Events after reopen", evs, err, "ok", "after")
}

// TestCorruptBadgerManifest: a format 1 store whose MANIFEST is damaged
// is not migrated and not touched.
func TestCorruptBadgerManifest(t *testing.T) {
	dir := t.TempDir()
	writeRaw(t, dir, map[string]string{"meta/format": "1", "mop/http/a:1": mustJSON(t, learned(10))})
	garbage := []byte(strings.Repeat("not a badger manifest\x00\xff", 20))
	if err := os.WriteFile(filepath.Join(dir, badger.ManifestFilename), garbage, 0o600); err != nil {
		t.Fatal(err)
	}
	checkRecoverable(t, dir, nil)
}

// TestMissingBadgerManifest: without its MANIFEST badger would start
// afresh and delete the tables it does not know; Open refuses instead.
func TestMissingBadgerManifest(t *testing.T) {
	dir := t.TempDir()
	writeRaw(t, dir, map[string]string{"meta/format": "1", "mop/http/a:1": mustJSON(t, learned(10))})
	if err := os.Remove(filepath.Join(dir, badger.ManifestFilename)); err != nil {
		t.Fatal(err)
	}
	checkRecoverable(t, dir, ErrCorrupt)
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestMigrateBadgerStore: a format 1 (Badger) store is read at Open:
// learned states and events (in their order) come over, the old files
// move to badger-v1, and the next Open does not migrate again. A
// read-only open of an unmigrated store reads it without changing it.
func TestMigrateBadgerStore(t *testing.T) {
	dir := t.TempDir()
	states := map[string]admission.MOPState{"http/127.0.0.1:18081": learned(120.5), "sip/[::1]:5070": learned(7)}
	kv := map[string]string{"meta/format": "1"}
	for k, st := range states {
		kv["mop/"+k] = mustJSON(t, st)
	}
	for i, msg := range []string{"a", "b1", "b2", "c"} {
		at := t0.Add(time.Duration(min(i, 2)) * time.Second) // b1, b2 at one instant
		if msg == "c" {
			at = t0.Add(3 * time.Second)
		}
		kv[string(eventKey(at, uint64(10+i)))] = mustJSON(t, ev(at, msg))
	}
	writeRaw(t, dir, kv)
	before := dirDigest(t, dir)

	ro := openTest(t, Config{Dir: dir, ReadOnly: true})
	got, err := ro.LoadMOP()
	if err != nil {
		t.Fatal(err)
	}
	checkStates(t, got, states)
	evs, err := ro.Events(time.Time{}, 0)
	checkMessages(t, "read-only Events", evs, err, "a", "b1", "b2", "c")
	tmp := ro.tmpDir
	if err := ro.Close(bg); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tmp); tmp == "" || !os.IsNotExist(err) {
		t.Errorf("temporary copy %q after Close: %v", tmp, err)
	}
	if after := dirDigest(t, dir); after != before {
		t.Fatalf("read-only open changed the store:\n%s\n%s", before, after)
	}

	s := openTest(t, Config{Dir: dir, SweepInterval: -1})
	got, err = s.LoadMOP()
	if err != nil {
		t.Fatal(err)
	}
	checkStates(t, got, states)
	evs, err = s.Events(time.Time{}, 0)
	checkMessages(t, "migrated Events", evs, err, "a", "b1", "b2", "c")
	appendAll(t, s, ev(t0.Add(4*time.Second), "d"))
	if err := s.Close(bg); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.Type().IsRegular() && isBadgerFile(e.Name()) && e.Name() != "LOCK" {
			t.Errorf("badger file %s still in the data directory", e.Name())
		}
	}
	if _, err := os.Stat(filepath.Join(dir, badgerDir, badger.ManifestFilename)); err != nil {
		t.Errorf("old files not kept in %s: %v", badgerDir, err)
	}
	s = openTest(t, Config{Dir: dir, SweepInterval: -1})
	got, _ = s.LoadMOP()
	checkStates(t, got, states)
	evs, err = s.Events(time.Time{}, 0)
	checkMessages(t, "Events after reopen", evs, err, "a", "b1", "b2", "c", "d")
	if err := s.Close(bg); err != nil {
		t.Fatal(err)
	}
	// A reset removes the kept old files too.
	s = openTest(t, Config{Dir: dir, Reset: true})
	if _, err := os.Stat(filepath.Join(dir, badgerDir)); !os.IsNotExist(err) {
		t.Errorf("%s after reset: %v", badgerDir, err)
	}
}

func TestNewStoreHasFormatVersion(t *testing.T) {
	dir := t.TempDir()
	openTest(t, Config{Dir: dir})
	b, err := os.ReadFile(filepath.Join(dir, formatFile))
	if err != nil || string(b) != "2\n" {
		t.Fatalf("format file = %q, %v; want \"2\\n\"", b, err)
	}
}

func TestLocked(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, Config{Dir: dir})
	if err := s.Save("http/a:1", learned(10)); err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []Config{{Dir: dir}, {Dir: dir, ReadOnly: true}, {Dir: dir, Reset: true}} {
		_, err := Open(cfg, nil)
		if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), dir) {
			t.Errorf("Open(%+v) while open elsewhere: %v; want ErrLocked naming %s", cfg, err, dir)
		}
	}
	// The refused reset removed nothing.
	got, err := s.LoadMOP()
	if err != nil || len(got) != 1 {
		t.Fatalf("LoadMOP after refused reset = %v, %v", got, err)
	}
}

func TestResetRefusesForeignFiles(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, Config{Dir: dir})
	s.Close(bg)
	foreign := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(foreign, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Open(Config{Dir: dir, Reset: true}, nil)
	if err == nil || !strings.Contains(err.Error(), "notes.txt") {
		t.Fatalf("reset of a directory with a foreign file: %v; want an error naming it", err)
	}
	if _, err := os.Stat(foreign); err != nil {
		t.Fatalf("foreign file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, formatFile)); err != nil {
		t.Fatalf("store files were touched: %v", err)
	}
}

// TestResetKeepsAffinityKey: the affinity key in the data directory is not
// a foreign file and outlives a reset.
func TestResetKeepsAffinityKey(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, Config{Dir: dir})
	if err := s.Save("http/a:1", learned(10)); err != nil {
		t.Fatal(err)
	}
	s.Close(bg)
	key := filepath.Join(dir, AffinityKeyFile)
	if err := os.WriteFile(key, []byte("0123456789abcdef0123456789abcdef"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Open(Config{Dir: dir, Reset: true}, nil)
	if err != nil {
		t.Fatalf("reset with the affinity key present: %v", err)
	}
	defer s.Close(bg)
	if states, _ := s.LoadMOP(); len(states) != 0 {
		t.Errorf("reset kept %d learned states", len(states))
	}
	if b, err := os.ReadFile(key); err != nil || string(b) != "0123456789abcdef0123456789abcdef" {
		t.Errorf("affinity key after reset: %q, %v", b, err)
	}
}

func TestReadOnly(t *testing.T) {
	dir := t.TempDir()
	_, err := Open(Config{Dir: filepath.Join(dir, "missing"), ReadOnly: true}, nil)
	if !errors.Is(err, ErrNoStore) {
		t.Fatalf("read-only open of a missing store: %v; want ErrNoStore", err)
	}

	s := openTest(t, Config{Dir: dir, SweepInterval: -1})
	if err := s.Save("http/a:1", learned(10)); err != nil {
		t.Fatal(err)
	}
	s.Append(admission.Event{Time: t0, Kind: admission.EventMOPLearned, Subject: "http/a:1", Message: "10/s"})
	if err := s.Close(bg); err != nil {
		t.Fatal(err)
	}

	ro1 := openTest(t, Config{Dir: dir, ReadOnly: true})
	ro2 := openTest(t, Config{Dir: dir, ReadOnly: true}) // shared lock: two readers are fine
	for _, ro := range []*Store{ro1, ro2} {
		got, err := ro.LoadMOP()
		if err != nil {
			t.Fatal(err)
		}
		checkStates(t, got, map[string]admission.MOPState{"http/a:1": learned(10)})
		evs, err := ro.Events(time.Time{}, 0)
		if err != nil || len(evs) != 1 {
			t.Fatalf("Events = %v, %v; want one event", evs, err)
		}
	}
	if err := ro1.Save("http/a:1", learned(1)); err == nil {
		t.Error("Save on a read-only store: got nil error")
	}
	ro1.Append(admission.Event{Kind: "x"})
	if ro1.EventsDropped() != 1 {
		t.Errorf("EventsDropped = %d, want 1", ro1.EventsDropped())
	}
	if _, err := Open(Config{Dir: dir}, nil); !errors.Is(err, ErrLocked) {
		t.Errorf("read-write open while readers hold the store: %v; want ErrLocked", err)
	}
}

func TestClosed(t *testing.T) {
	s := openTest(t, Config{Dir: t.TempDir()})
	if err := s.Close(bg); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(bg); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := s.Save("http/a:1", learned(1)); !errors.Is(err, ErrClosed) {
		t.Errorf("Save after Close: %v; want ErrClosed", err)
	}
	if _, err := s.Events(time.Time{}, 0); !errors.Is(err, ErrClosed) {
		t.Errorf("Events after Close: %v; want ErrClosed", err)
	}
	s.Append(admission.Event{Kind: "x"})
	if s.EventsDropped() != 1 {
		t.Errorf("EventsDropped after Close = %d, want 1", s.EventsDropped())
	}
	if _, err := s.NewSaver(func() map[string]admission.MOPState { return nil }); !errors.Is(err, ErrClosed) {
		t.Errorf("NewSaver after Close: %v; want ErrClosed", err)
	}
}

func TestIsStoreFile(t *testing.T) {
	for name, want := range map[string]bool{
		"LOCK": true, "MANIFEST": true, "KEYREGISTRY": true, "DISCARD": true,
		"000001.sst": true, "000001.vlog": true, "00001.mem": true, "000002.sst.tmp": true,
		"format": true, "mop.json": true, "mop.json.tmp": true, "events-00000000000000000001.log": true,
		"events-1.log": false, "events-00000000000000000001.txt": false,
		"notes.txt": false, "x.sst": false, ".sst": false, "000001": false, "sluice.log": false,
	} {
		if got := isStoreFile(name); got != want {
			t.Errorf("isStoreFile(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestOpenHeap: opening a store with a full event log keeps little
// heap (the index holds a few numbers per segment, not the events).
func TestOpenHeap(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir, SweepInterval: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20_000 {
		s.Append(admission.Event{Time: t0.Add(time.Duration(i) * time.Millisecond), Kind: admission.EventMOPLearned,
			Subject: "http 127.0.0.1:18081", Message: strings.Repeat("x", 100)})
		if i%1000 == 999 {
			s.Flush()
		}
	}
	if err := s.Close(bg); err != nil {
		t.Fatal(err)
	}
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	heap := func() int64 {
		runtime.GC()
		metrics.Read(sample)
		return int64(sample[0].Value.Uint64())
	}
	before := heap()
	start := time.Now()
	s = openTest(t, Config{Dir: dir, SweepInterval: -1})
	took := time.Since(start)
	added := heap() - before
	t.Logf("open with 20000 events took %v, heap added %.1f MB", took, float64(added)/1e6)
	if added > 4<<20 {
		t.Errorf("opening the store added %d bytes of heap; want the events left on disk", added)
	}
	if n := s.eventCount(); n != 20_000 {
		t.Errorf("eventCount = %d, want 20000", n)
	}
	runtime.KeepAlive(s)
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
