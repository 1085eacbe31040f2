package persist

import (
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

// openTest opens a store in dir and closes it when the test ends.
func openTest(t *testing.T, cfg Config) *Store {
	t.Helper()
	s, err := Open(cfg, nil)
	if err != nil {
		t.Fatalf("Open(%s): %v", cfg.Dir, err)
	}
	t.Cleanup(func() { s.Close() })
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
	if err := s.Close(); err != nil {
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

// TestOldCorruptEvent: Open decodes only the newest events; a bad older
// one is reported when it is read, not skipped.
func TestOldCorruptEvent(t *testing.T) {
	dir := t.TempDir()
	kv := map[string]string{"meta/format": "1", string(eventKey(t0, 0)): "{bad"}
	for i := 1; i <= openCheckEvents; i++ {
		kv[string(eventKey(t0.Add(time.Duration(i)*time.Second), uint64(i)))] =
			`{"time":"2026-11-29T15:00:00Z","kind":"config.warning","message":"ok"}`
	}
	writeRaw(t, dir, kv)
	s := openTest(t, Config{Dir: dir, SweepInterval: -1})
	if evs, err := s.Tail(10); err != nil || len(evs) != 10 {
		t.Fatalf("Tail(10) = %d events, %v", len(evs), err)
	}
	_, err := s.Events(time.Time{}, 0)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("Events over a bad record: %v; want ErrCorrupt naming %s", err, dir)
	}
}

func TestCorruptManifest(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, Config{Dir: dir})
	if err := s.Save("http/a:1", learned(10)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	garbage := []byte(strings.Repeat("not a badger manifest\x00\xff", 20))
	if err := os.WriteFile(filepath.Join(dir, badger.ManifestFilename), garbage, 0o600); err != nil {
		t.Fatal(err)
	}
	checkRecoverable(t, dir, nil)
}

// TestMissingManifest: without its MANIFEST badger would start afresh and
// delete the tables it does not know; Open refuses instead.
func TestMissingManifest(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, Config{Dir: dir})
	if err := s.Save("http/a:1", learned(10)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, badger.ManifestFilename)); err != nil {
		t.Fatal(err)
	}
	checkRecoverable(t, dir, ErrCorrupt)
}

func TestNewStoreHasFormatVersion(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, Config{Dir: dir})
	var v []byte
	err := s.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(formatKey)
		if err != nil {
			return err
		}
		v, err = item.ValueCopy(nil)
		return err
	})
	if err != nil || string(v) != "1" {
		t.Fatalf("format key = %q, %v; want \"1\"", v, err)
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
	s.Close()
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
	if _, err := os.Stat(filepath.Join(dir, badger.ManifestFilename)); err != nil {
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
	s.Close()
	key := filepath.Join(dir, AffinityKeyFile)
	if err := os.WriteFile(key, []byte("0123456789abcdef0123456789abcdef"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Open(Config{Dir: dir, Reset: true}, nil)
	if err != nil {
		t.Fatalf("reset with the affinity key present: %v", err)
	}
	defer s.Close()
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
	if err := s.Close(); err != nil {
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
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
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
		"notes.txt": false, "x.sst": false, ".sst": false, "000001": false, "sluice.log": false,
	} {
		if got := isStoreFile(name); got != want {
			t.Errorf("isStoreFile(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestOpenHeap guards the small-memory options: with badger's defaults
// opening adds ~88 MB of Go heap, with ours about 1.5 MB.
func TestOpenHeap(t *testing.T) {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	heap := func() int64 {
		runtime.GC()
		metrics.Read(sample)
		return int64(sample[0].Value.Uint64())
	}
	before := heap()
	start := time.Now()
	s := openTest(t, Config{Dir: t.TempDir()})
	took := time.Since(start)
	added := heap() - before
	t.Logf("open took %v, heap added %.1f MB", took, float64(added)/1e6)
	if added > 32<<20 {
		t.Errorf("opening the store added %d bytes of heap; the small-memory options are not in effect", added)
	}
	runtime.KeepAlive(s)
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
