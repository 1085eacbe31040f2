package persist

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestReadOnlyStoreTrustsNoFile: a read-only open (sluice events) skips
// and counts a line that does not decode and a segment that is a link;
// a segment replaced by a FIFO after the open is left out without a hang;
// a read-write open still refuses the bad line, and only it mentions
// -data-reset.
func TestReadOnlyStoreTrustsNoFile(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, Config{Dir: dir, SweepInterval: -1})
	appendAll(t, s, ev(t0, "a"), ev(t0.Add(time.Second), "b"))
	if err := s.Close(bg); err != nil {
		t.Fatal(err)
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "events-*.log"))
	f, _ := os.OpenFile(segs[0], os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString("garbage\n")
	f.Close()
	other := filepath.Join(t.TempDir(), "x.log")
	os.WriteFile(other, []byte(`{"time":"2026-11-29T15:00:05Z","kind":"k","message":"linked","seq":50}`+"\n"), 0o600)
	os.Symlink(other, filepath.Join(dir, "events-00000000000000000050.log"))

	ro, err := Open(Config{Dir: dir, ReadOnly: true}, nil)
	if err != nil {
		t.Fatalf("read-only open: %v", err)
	}
	defer ro.Close(bg)
	if sk := ro.Skipped(); sk != (Skipped{Lines: 1, Files: 1}) {
		t.Errorf("Skipped() = %+v, want 1 line and 1 file", sk)
	}
	os.Remove(segs[0])
	if err := syscall.Mkfifo(segs[0], 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		evs, err := ro.Events(t0.Add(-time.Hour), 0)
		if err != nil || len(evs) != 0 {
			t.Errorf("events after the segment became a FIFO: %v, %v; want none and no error", messages(evs), err)
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("reading a segment replaced by a FIFO does not return")
	}
	ro.Close(bg)

	os.Remove(segs[0])
	os.WriteFile(segs[0], []byte(`{"time":"2026-11-29T15:00:00Z","kind":"config.warning","message":"a","seq":1}`+"\ngarbage\n"), 0o600)
	os.Remove(filepath.Join(dir, "events-00000000000000000050.log"))
	if _, err := Open(Config{Dir: dir}, nil); err == nil || !strings.Contains(err.Error(), "data-reset") {
		t.Errorf("read-write open of a bad line: %v, want a refusal that names -data-reset", err)
	}
}
