package persist

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluicelb/sluice/admission"
)

// TestMOPFileRateOutOfRange: a mop.json whose rate would turn MOP off
// (1e12/s) is refused at Open as corrupt, naming the file, the value and
// -data-reset, and is never wiped silently.
func TestMOPFileRateOutOfRange(t *testing.T) {
	for _, body := range []string{
		`{"http/a:1":{"phase":1,"learned_rate":1e12,"allowed_rate":1e12}}`,
		`{"http/a:1":{"phase":0,"learned_rate":0,"allowed_rate":1e12}}`,
	} {
		dir := t.TempDir()
		writeFiles(t, dir, map[string]string{formatFile: "2\n", mopFile: body})
		_, err := Open(Config{Dir: dir}, nil)
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), mopFile) || !strings.Contains(err.Error(), "1e+12") {
			t.Fatalf("Open with %s: %v; want ErrCorrupt naming %s and the rate", body, err, mopFile)
		}
		checkRecoverable(t, dir, ErrCorrupt)
	}
	// The highest rate MOP itself can reach is stored and read back.
	dir := t.TempDir()
	s := openTest(t, Config{Dir: dir})
	top := admission.MOPState{Phase: admission.Learned, LearnedRate: admission.MaxMOPRate, AllowedRate: admission.MaxMOPRate}
	if err := s.Save("http/a:1", top); err != nil {
		t.Fatal(err)
	}
	if err := s.Save("http/b:1", admission.MOPState{Phase: admission.Learned, LearnedRate: 1e12, AllowedRate: 1e12}); err == nil {
		t.Error("Save of a 1e12/s rate: got nil error")
	}
}

// TestSaveMOPKeepsConfirmedOverProvisional: a state moved by one memory
// sample is not written; the one stored before it stays, also on disk.
func TestSaveMOPKeepsConfirmedOverProvisional(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Save("http/a:1", learned(100)); err != nil {
		t.Fatal(err)
	}
	prov := learned(50)
	prov.Provisional = true
	if err := s.Save("http/a:1", prov); err != nil {
		t.Fatal(err)
	}
	got, _ := s.LoadMOP()
	checkStates(t, got, map[string]admission.MOPState{"http/a:1": learned(100)})
	if err := s.Close(bg); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, Config{Dir: dir})
	got, _ = s.LoadMOP()
	checkStates(t, got, map[string]admission.MOPState{"http/a:1": learned(100)})
}
