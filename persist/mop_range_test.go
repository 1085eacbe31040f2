package persist

import (
	"errors"
	"strings"
	"testing"
	"time"

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

// TestOneSampleCutNotPersisted: a learned rate that one memory sample cut
// is not what a restart finds; once a second sample confirms the cut, it
// is.
func TestOneSampleCutNotPersisted(t *testing.T) {
	m, err := admission.NewMOP(admission.MOPConfig{Name: "b", Window: time.Minute, MaxHeap: 0.85})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Import(admission.MOPState{Phase: admission.Learned, LearnedRate: 100, AllowedRate: 100, Base: 0.8, Slope: 0.05 / 100}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s := openTest(t, Config{Dir: dir})
	save := func() {
		t.Helper()
		if err := s.Save("http/a:1", m.Export()); err != nil {
			t.Fatal(err)
		}
	}
	stored := func() float64 {
		t.Helper()
		if err := s.Close(bg); err != nil {
			t.Fatal(err)
		}
		s = openTest(t, Config{Dir: dir})
		got, err := s.LoadMOP()
		if err != nil {
			t.Fatal(err)
		}
		return got["http/a:1"].LearnedRate
	}
	var clock admission.ManualClock
	for range 10 {
		m.Observe(clock.Advance(time.Second), 82, 100)
	}
	save()
	m.Observe(clock.Advance(time.Second), 100, 100) // one sample at max memory
	if got := m.Status().LearnedRate; got >= 100 {
		t.Fatalf("learned %v after memory at max: want a cut", got)
	}
	save()
	if got := stored(); got != 100 {
		t.Errorf("after one sample the store holds %v/s, want the 100/s before it", got)
	}
	m.Observe(clock.Advance(time.Second), 95, 100) // a second one over the ceiling
	save()
	if got, want := stored(), m.Status().LearnedRate; got != want {
		t.Errorf("after a confirming sample the store holds %v/s, want the cut %v/s", got, want)
	}
}
