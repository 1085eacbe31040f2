package persist

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/internal/testenv"
)

// storeChildEnv makes the test binary the store process (fd 3).
const storeChildEnv = "SLUICE_PERSIST_STORE_CHILD"

func storeChildMain(dir string) {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := RunChild(dir, os.NewFile(3, "store-socket"), os.NewFile(4, "store-journal"), log); err != nil {
		fmt.Fprintln(os.Stderr, "store child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// testChild runs this test binary as the store process.
func testChild(dir string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), storeChildEnv+"="+dir)
	cmd.Stderr = os.Stderr
	return cmd
}

// cfg3 is a format 3 store on dir with short backoffs, so that tests
// that kill the store process do not wait a second per restart.
func cfg3(dir string) Config {
	return Config{Dir: dir, Child: testChild, Interval: 10 * time.Millisecond, SweepInterval: -1,
		childMinBackoff: 10 * time.Millisecond, childMaxBackoff: 50 * time.Millisecond}
}

func skipShort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts store processes")
	}
}

func TestFormat3RoundTripAndQueries(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	s := openTest(t, cfg3(dir))
	if h := s.Health(); h.Child != ChildRunning || !h.Healthy {
		t.Fatalf("health after open: %+v", h)
	}
	states := map[string]admission.MOPState{"http/127.0.0.1:18081": learned(120.5), "sip/[::1]:5070": learned(7)}
	if err := s.SaveMOP(states); err != nil {
		t.Fatal(err)
	}
	if err := s.SetOverride(Override{Key: "backend/http/h1/drain", Value: "true", By: "test", At: t0}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetClusterNodes(3); err != nil {
		t.Fatal(err)
	}
	// Golden events: kinds and subjects at known times.
	type e struct {
		sec     int
		kind    string
		subject string
	}
	golden := []e{{0, "mop.learned", "http a"}, {1, "backend.down", "http a"}, {2, "mop.learned", "http b"},
		{3, "mop.learned", "http a"}, {4, "memory.state", ""}, {5, "mop.learned", "http b"}}
	for i, g := range golden {
		s.Append(admission.Event{Time: t0.Add(time.Duration(g.sec) * time.Second), Kind: admission.EventKind(g.kind),
			Subject: g.subject, Message: fmt.Sprint(i)})
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	msgs := func(evs []admission.Event) string {
		var m []string
		for _, ev := range evs {
			m = append(m, ev.Message)
		}
		return strings.Join(m, ",")
	}
	for _, tc := range []struct {
		name    string
		q       EventQuery
		want    string
		more    bool
		omitted int
	}{
		{"all", EventQuery{}, "0,1,2,3,4,5", false, 0},
		{"since", EventQuery{Since: t0.Add(2 * time.Second)}, "2,3,4,5", false, 0},
		{"range", EventQuery{Since: t0.Add(time.Second), Until: t0.Add(4 * time.Second)}, "1,2,3", false, 0},
		{"type", EventQuery{Kind: "mop.learned"}, "0,2,3,5", false, 0},
		{"type since", EventQuery{Kind: "mop.learned", Since: t0.Add(3 * time.Second)}, "3,5", false, 0},
		{"type limit", EventQuery{Kind: "mop.learned", Limit: 2}, "0,2", true, 0},
		{"type newest", EventQuery{Kind: "mop.learned", Limit: 2, Newest: true}, "3,5", false, 2},
		{"subject", EventQuery{Subject: "http a"}, "0,1,3", false, 0},
		{"type and subject", EventQuery{Kind: "mop.learned", Subject: "http b"}, "2,5", false, 0},
		{"type and subject newest", EventQuery{Kind: "mop.learned", Subject: "http a", Limit: 1, Newest: true}, "3", false, 1},
		{"newest", EventQuery{Limit: 2, Newest: true, Until: t0.Add(5 * time.Second)}, "3,4", false, 3},
		{"unknown type", EventQuery{Kind: "nope"}, "", false, 0},
	} {
		evs, more, omitted, err := s.Query(tc.q)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := msgs(evs); got != tc.want || more != tc.more || omitted != tc.omitted {
			t.Errorf("%s: got %q more=%v omitted=%d, want %q more=%v omitted=%d", tc.name, got, more, omitted, tc.want, tc.more, tc.omitted)
		}
	}
	if evs, err := s.Tail(2); err != nil || msgs(evs) != "4,5" {
		t.Errorf("Tail(2) = %q, %v", msgs(evs), err)
	}
	if evs, omitted, err := s.Newest(t0.Add(time.Second), 3); err != nil || msgs(evs) != "3,4,5" || omitted != 2 {
		t.Errorf("Newest = %q %d, %v", msgs(evs), omitted, err)
	}
	if err := s.Close(bg); err != nil {
		t.Fatal(err)
	}

	s = openTest(t, cfg3(dir))
	got, _ := s.LoadMOP()
	checkStates(t, got, states)
	if ovs := s.Overrides(); len(ovs) != 1 || ovs[0].Value != "true" {
		t.Errorf("overrides after reopen: %+v", ovs)
	}
	if n := s.ClusterNodes(); n != 3 {
		t.Errorf("cluster nodes after reopen: %d", n)
	}
	if evs, err := s.Events(time.Time{}, 0); err != nil || msgs(evs) != "0,1,2,3,4,5" {
		t.Errorf("events after reopen: %q, %v", msgs(evs), err)
	}
	// The sequence continues: a new event at t0 sorts after the old ones at t0.
	s.Append(admission.Event{Time: t0, Kind: "x", Message: "6"})
	s.Flush()
	if evs, _, _, err := s.Query(EventQuery{Until: t0.Add(time.Second)}); err != nil || msgs(evs) != "0,6" {
		t.Errorf("same-time order: %q, %v", msgs(evs), err)
	}
	if v, _ := os.ReadFile(filepath.Join(dir, formatFile)); strings.TrimSpace(string(v)) != "3" {
		t.Errorf("format file %q", v)
	}
}

func TestFormat3Sweep(t *testing.T) {
	skipShort(t)
	now := t0.Add(10 * time.Hour)
	cfg := cfg3(t.TempDir())
	cfg.Now = func() time.Time { return now }
	cfg.EventsRetention = time.Hour
	cfg.EventsMax = 3
	s := openTest(t, cfg)
	for i := range 8 { // 2 older than the retention, then 6 of which 3 are kept
		at := now.Add(-2*time.Hour + time.Duration(i)*time.Minute)
		if i >= 2 {
			at = now.Add(-time.Duration(10-i) * time.Minute)
		}
		s.Append(admission.Event{Time: at, Kind: "k", Subject: "b", Message: fmt.Sprint(i)})
	}
	s.Flush()
	n, err := s.SweepEvents()
	if err != nil || n != 5 {
		t.Fatalf("SweepEvents = %d, %v; want 5", n, err)
	}
	for _, q := range []EventQuery{{}, {Kind: "k"}, {Subject: "b"}} {
		evs, _, _, err := s.Query(q)
		if err != nil || len(evs) != 3 || evs[0].Message != "5" {
			t.Errorf("after sweep %+v: %v, %v", q, evs, err)
		}
	}
}

func TestDialogsAndHistory(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	s := openTest(t, cfg3(dir))
	now := time.Now()
	s.PutDialogs([]DialogRecord{
		{Key: 1, Backend: "sip/a", ToTag: 7, Src: 9, Expires: now.Add(time.Hour)},
		{Key: 2, Backend: "sip/b", Linger: true, Expires: now.Add(2 * time.Hour)},
		{Key: 3, Backend: "sip/c", Expires: now.Add(-time.Second)}, // expired: not stored
		{Key: 4, Backend: "sip/d", Expires: now.Add(time.Minute)},
	})
	s.DeleteDialogs([]uint64{4})
	// Removed and set up again, in one batch and across batches: stored.
	s.PutDialogs([]DialogRecord{{Key: 5, Backend: "sip/e", Expires: now.Add(time.Hour)}})
	s.DeleteDialogs([]uint64{5})
	s.PutDialogs([]DialogRecord{{Key: 5, Backend: "sip/e2", Expires: now.Add(time.Hour)}})
	// A later record with an expiry past replaces a longer-lived one.
	s.PutDialogs([]DialogRecord{{Key: 6, Backend: "sip/f", Expires: now.Add(time.Hour)}})
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	s.PutDialogs([]DialogRecord{{Key: 6, Backend: "sip/f", Linger: true, Expires: now.Add(-time.Millisecond)}})
	s.DeleteDialogs([]uint64{5})
	s.PutDialogs([]DialogRecord{{Key: 5, Backend: "sip/e3", Expires: now.Add(time.Hour)}})
	s.SaveHistory([]HistorySample{
		{Time: now.Add(-2 * time.Second), Resolution: "1s", Data: []byte("a")},
		{Time: now.Add(-time.Second), Resolution: "1s", Data: []byte("b")},
		{Time: now.Add(-time.Second), Resolution: "10s", Data: []byte("c")},
		{Time: now.Add(-48 * time.Hour), Resolution: "10s", Data: []byte("old")}, // past retention
	})
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	s.Close(bg)
	s = openTest(t, cfg3(dir))
	defer func(d, h int) { dialogPage, historyPage = d, h }(dialogPage, historyPage)
	dialogPage, historyPage = 1, 1 // every record its own answer
	ds, err := s.LoadDialogs(now, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []DialogRecord{{Key: 1, Backend: "sip/a", ToTag: 7, Src: 9}, {Key: 2, Backend: "sip/b", Linger: true}, {Key: 5, Backend: "sip/e3"}}
	if len(ds) != len(want) {
		t.Fatalf("dialogs: %+v", ds)
	}
	for i := range ds {
		w := want[i]
		d := ds[i]
		if d.Key != w.Key || d.Backend != w.Backend || d.ToTag != w.ToTag || d.Src != w.Src || d.Linger != w.Linger {
			t.Errorf("dialog %d: %+v, want %+v", i, d, w)
		}
	}
	// Past the first's expiry only the second is left.
	if ds, _ := s.LoadDialogs(now.Add(90*time.Minute), 0); len(ds) != 1 || ds[0].Key != 2 {
		t.Errorf("dialogs after 90m: %+v", ds)
	}
	hs, err := s.LoadHistory("1s", now.Add(-90*time.Second), 0)
	if err != nil || len(hs) != 2 || string(hs[0].Data) != "a" || string(hs[1].Data) != "b" {
		t.Errorf("history 1s: %+v, %v", hs, err)
	}
	if hs, _ := s.LoadHistory("10s", time.Time{}, 0); len(hs) != 1 || string(hs[0].Data) != "c" {
		t.Errorf("history 10s: %+v", hs)
	}
	// A cap on what is loaded, across pages.
	if ds, _ := s.LoadDialogs(now, 2); len(ds) != 2 || ds[0].Key != 1 || ds[1].Key != 2 {
		t.Errorf("dialogs, at most 2: %+v", ds)
	}
	if hs, _ := s.LoadHistory("1s", time.Time{}, 1); len(hs) != 1 || string(hs[0].Data) != "a" {
		t.Errorf("history 1s, at most 1: %+v", hs)
	}
	// EachDialogs: the same records a page at a time, never a page over
	// dialogPage, the cap cutting the page it falls in.
	dialogPage = 2
	for _, tc := range []struct{ max, want int }{{0, 3}, {3, 3}, {2, 2}, {1, 1}} {
		var keys []uint64
		pages := 0
		n, err := s.EachDialogs(now, tc.max, func(page []DialogRecord) {
			pages++
			if len(page) == 0 || len(page) > dialogPage {
				t.Errorf("max %d: a page of %d records, want 1 to %d", tc.max, len(page), dialogPage)
			}
			for _, d := range page {
				keys = append(keys, d.Key)
			}
		})
		if err != nil || n != tc.want || len(keys) != tc.want || keys[0] != 1 || pages != (tc.want+1)/2 {
			t.Errorf("max %d: handed %d (keys %v) in %d pages, %v; want %d in %d pages", tc.max, n, keys, pages, err, tc.want, (tc.want+1)/2)
		}
	}
}

// TestMigrateFormat2To3: a store written by format 2 is read at open and
// written into the store process; its files move to format2/.
func TestMigrateFormat2To3(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	v2, err := Open(Config{Dir: dir}, nil)
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]admission.MOPState{"http/127.0.0.1:18081": learned(55)}
	v2.SaveMOP(states)
	v2.SetOverride(Override{Key: "rule/x/limit", Value: "9", At: t0})
	for i := range 3 {
		v2.Append(ev(t0.Add(time.Duration(i)*time.Second), fmt.Sprint("m", i)))
	}
	if err := v2.Close(bg); err != nil {
		t.Fatal(err)
	}
	s := openTest(t, cfg3(dir))
	got, _ := s.LoadMOP()
	checkStates(t, got, states)
	if ovs := s.Overrides(); len(ovs) != 1 || ovs[0].Value != "9" {
		t.Errorf("overrides: %+v", ovs)
	}
	evs, err := s.Events(time.Time{}, 0)
	checkMessages(t, "migrated events", evs, err, "m0", "m1", "m2")
	if v, _ := os.ReadFile(filepath.Join(dir, formatFile)); strings.TrimSpace(string(v)) != "3" {
		t.Errorf("format file %q", v)
	}
	if _, err := os.Stat(filepath.Join(dir, v2Dir, mopFile)); err != nil {
		t.Errorf("format 2 files not kept: %v", err)
	}
	s.Close(bg)
	// Opened again, nothing is migrated twice.
	s = openTest(t, cfg3(dir))
	evs, err = s.Events(time.Time{}, 0)
	checkMessages(t, "events after second open", evs, err, "m0", "m1", "m2")
}

// TestMigrateFormat1To3: a Badger store of format 1 goes through format 2
// into format 3.
func TestMigrateFormat1To3(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	states := map[string]admission.MOPState{"sip/[::1]:5070": learned(7)}
	kv := map[string]string{"meta/format": "1", "mop/sip/[::1]:5070": mustJSON(t, learned(7))}
	kv[string(eventKey(t0, 1))] = mustJSON(t, ev(t0, "v1"))
	writeRaw(t, dir, kv)
	s := openTest(t, cfg3(dir))
	got, _ := s.LoadMOP()
	checkStates(t, got, states)
	evs, err := s.Events(time.Time{}, 0)
	checkMessages(t, "format 1 events", evs, err, "v1")
	if _, err := os.Stat(filepath.Join(dir, badgerDir)); err != nil {
		t.Errorf("format 1 files not kept: %v", err)
	}
}

func TestFormat3CorruptFormatRefused(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, formatFile), []byte("9\n"), 0o600)
	_, err := Open(cfg3(dir), nil)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "-data-reset") {
		t.Fatalf("Open of format 9: %v", err)
	}
}

// load appends events and saves learned states until stop is closed,
// as the node does under traffic; it returns how many events it appended.
func load(s *Store, stop chan struct{}, wg *sync.WaitGroup, appended *atomic.Int64, rate *atomic.Int64) {
	defer wg.Done()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		s.Append(admission.Event{Kind: "load", Message: fmt.Sprint(i)})
		appended.Add(1)
		if i%10 == 0 {
			r := float64(100 + i)
			s.SaveMOP(map[string]admission.MOPState{"http/b:1": learned(r)})
			rate.Store(int64(r))
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// TestChildKilledUnderLoad: the store process killed with SIGKILL and
// with SIGBUS while events and states are written: the balancer keeps
// running, sees the death (event persist.child_died naming the signal,
// Health), restarts it, and writes what was queued meanwhile; nothing is
// lost that was not counted as dropped, and the last learned state is
// the stored one.
func TestChildKilledUnderLoad(t *testing.T) {
	skipShort(t)
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGBUS} {
		t.Run(signalNames[sig], func(t *testing.T) {
			dir := t.TempDir()
			s := openTest(t, cfg3(dir))
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var appended, rate atomic.Int64
			wg.Add(1)
			go load(s, stop, &wg, &appended, &rate)
			for round := range 3 {
				waitUntil(t, "events written", func() bool { return appended.Load() > int64(200*(round+1)) })
				s.rc.mu.Lock()
				p := s.rc.proc
				s.rc.mu.Unlock()
				if p == nil {
					t.Fatal("no store process")
				}
				p.Signal(sig)
				waitUntil(t, "restart", func() bool {
					h := s.Health()
					return h.ChildRestarts >= uint64(round+1) && h.Child == ChildRunning
				})
			}
			close(stop)
			wg.Wait()
			// On a loaded machine a restarted store process may miss its
			// start-up deadline and be restarted once more: what is queued
			// must be written once one runs (the restarts are checked below).
			waitUntil(t, "queue written", func() bool { return s.Flush() == nil })
			h := s.Health()
			evs, err := s.Events(time.Time{}, 0)
			if err != nil {
				t.Fatal(err)
			}
			k := kinds(evs)
			if k["persist.child_died"] != int(h.ChildRestarts) || h.ChildRestarts < 3 {
				t.Errorf("persist.child_died events: %d, restarts %d, want 3 or more of both", k["persist.child_died"], h.ChildRestarts)
			}
			killed := 0
			for _, ev := range evs {
				if ev.Kind == "persist.child_died" && ev.Subject == signalNames[sig] {
					killed++
				}
			}
			if killed < 3 {
				t.Errorf("%d persist.child_died events name %s, want 3", killed, signalNames[sig])
			}
			// Every appended event is stored or counted as dropped.
			if got := int64(k["load"]) + int64(h.EventsDropped); got != appended.Load() {
				t.Errorf("stored %d + dropped %d = %d, appended %d", k["load"], h.EventsDropped, got, appended.Load())
			}
			want := rate.Load()
			if err := s.Close(bg); err != nil {
				t.Fatal(err)
			}
			s2 := openTest(t, cfg3(dir))
			got, _ := s2.LoadMOP()
			if st := got["http/b:1"]; int64(st.LearnedRate) != want {
				t.Errorf("learned rate after restart %v, want %d", st.LearnedRate, want)
			}
		})
	}
}

// TestChildQueueBounded: while the store process is down, what waits is
// bounded; beyond QueueMax the oldest events are dropped and counted.
func TestChildQueueBounded(t *testing.T) {
	skipShort(t)
	cfg := cfg3(t.TempDir())
	cfg.QueueMax = 50
	var broken atomic.Bool
	cfg.Child = func(dir string) *exec.Cmd {
		if broken.Load() {
			return exec.Command("false")
		}
		return testChild(dir)
	}
	s := openTest(t, cfg)
	broken.Store(true)
	s.rc.mu.Lock()
	s.rc.proc.Kill()
	s.rc.mu.Unlock()
	waitUntil(t, "child down", func() bool { return s.Health().Child == ChildDown })
	for i := range 200 {
		s.Append(admission.Event{Kind: "k", Message: fmt.Sprint(i)})
	}
	h := s.Health()
	if h.EventsPending > 50 || h.EventsDropped < 150 || h.Healthy {
		t.Errorf("health while down: %+v", h)
	}
	broken.Store(false)
	waitUntil(t, "child back", func() bool { return s.Health().Child == ChildRunning })
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	evs, _, _, err := s.Query(EventQuery{Kind: "k"})
	if err != nil || len(evs) == 0 || len(evs) > 50 {
		t.Fatalf("stored after return: %d, %v", len(evs), err)
	}
}

// TestChildNeverStarts: a store process that never answers does not hold
// up Open beyond ChildStartTimeout, and Close ends it by PID.
func TestChildNeverStarts(t *testing.T) {
	skipShort(t)
	cfg := cfg3(t.TempDir())
	cfg.ChildStartTimeout = 200 * time.Millisecond
	cfg.ChildCallTimeout = 200 * time.Millisecond
	var procs []*os.Process
	var mu sync.Mutex
	cfg.Child = func(string) *exec.Cmd {
		cmd := exec.Command("sleep", "600")
		return cmd
	}
	s, err := Open(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := s.Health()
	if h.Child == ChildRunning || h.Healthy {
		t.Errorf("health: %+v", h)
	}
	s.rc.mu.Lock()
	if s.rc.proc != nil {
		mu.Lock()
		procs = append(procs, s.rc.proc)
		mu.Unlock()
	}
	s.rc.mu.Unlock()
	// Writes go on without blocking.
	s.Append(admission.Event{Kind: "k"})
	s.SaveMOP(map[string]admission.MOPState{"http/b:1": learned(5)})
	if err := s.Close(bg); err == nil {
		t.Log("Close reported nothing lost") // what was queued could not be written
	}
	for _, p := range procs {
		if err := p.Signal(syscall.Signal(0)); err == nil {
			t.Errorf("store process %d still running after Close", p.Pid)
		}
	}
}

// TestDataDirRemovedFormat3: the store process exits when its directory
// is removed (Badger would write into unlinked files), and the new one
// makes it again; writes after that are stored.
func TestDataDirRemovedFormat3(t *testing.T) {
	skipShort(t)
	root := t.TempDir()
	dir := filepath.Join(root, "data")
	s := openTest(t, cfg3(dir))
	s.Append(admission.Event{Kind: "before"})
	s.Flush()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "store process restarted", func() bool {
		h := s.Health()
		return h.ChildRestarts >= 1 && h.Child == ChildRunning
	})
	s.Append(admission.Event{Kind: "after"})
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	evs, _, _, err := s.Query(EventQuery{Kind: "after"})
	if err != nil || len(evs) != 1 {
		t.Fatalf("after: %v %v", evs, err)
	}
	if !strings.Contains(s.Health().ChildLastExit, "exit status 3") {
		t.Errorf("last exit %q", s.Health().ChildLastExit)
	}
	_ = slices.Clone(evs)
}

// mountTmpfs mounts a small tmpfs (as root) and unmounts it at Cleanup.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Missing(t, "needs root to mount a tmpfs (run the tests as root to cover a filesystem that fills up)")
	}
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0700", "tmpfs", mnt).CombinedOutput(); err != nil {
		testenv.Missing(t, fmt.Sprintf("cannot mount a tmpfs: %v %s", err, out))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", mnt, err, out)
		}
	})
	return mnt
}

// fill writes a file until the filesystem is full.
func fill(t *testing.T, name string) {
	t.Helper()
	f, err := os.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling: %v", err)
			}
			return
		}
	}
}

// TestTmpfsFullAndReadOnlyFormat3: Badger in the store process on a
// 16 MiB tmpfs that fills up (Badger's SIGBUS) and is then remounted
// read-only, while events and learned states are written as under
// traffic: this process keeps running, the store process dies or fails
// and is restarted, everything resumes by itself once the filesystem
// takes writes again, and the last learned state is the stored one.
func TestTmpfsFullAndReadOnlyFormat3(t *testing.T) {
	skipShort(t)
	mnt := mountTmpfs(t, "16m") // room for Badger's 4 MiB memtable file, and a filler fills it
	fmt.Printf("TestTmpfsFullAndReadOnlyFormat3: running on a 16 MiB tmpfs at %s\n", mnt)
	dir := filepath.Join(mnt, "data")
	cfg := cfg3(dir)
	cfg.ChildCallTimeout = time.Second
	var hold atomic.Bool // no store process starts while set
	cfg.Child = func(dir string) *exec.Cmd {
		if hold.Load() {
			return exec.Command("false")
		}
		return testChild(dir)
	}
	s := openTest(t, cfg)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var appended, rate atomic.Int64
	wg.Add(1)
	go load(s, stop, &wg, &appended, &rate)
	var once sync.Once
	stopLoad := func() { once.Do(func() { close(stop); wg.Wait() }) }
	defer stopLoad()
	waitUntil(t, "first writes", func() bool { return appended.Load() > 200 })

	filler := filepath.Join(mnt, "filler")
	fill(t, filler)
	waitUntil(t, "the store process to fail on the full disk", func() bool {
		h := s.Health()
		return !h.Healthy || h.ChildRestarts > 0
	})
	h := s.Health()
	t.Logf("full: %+v", h)
	os.Remove(filler)
	waitUntil(t, "recovery after the disk has room", func() bool {
		h := s.Health()
		return h.Healthy && h.Child == ChildRunning && s.Flush() == nil
	})

	// The kernel refuses to remount read-only a filesystem with files open
	// for writing (EBUSY), as Badger's are: the store process is stopped
	// for the remount and started again on the read-only filesystem.
	hold.Store(true)
	s.rc.mu.Lock()
	if s.rc.proc != nil {
		s.rc.proc.Kill()
	}
	s.rc.mu.Unlock()
	waitUntil(t, "store process down", func() bool { return s.Health().Child == ChildDown })
	restarts := s.Health().ChildRestarts
	if out, err := exec.Command("mount", "-o", "remount,ro", mnt).CombinedOutput(); err != nil {
		t.Fatalf("remount ro: %v %s", err, out)
	}
	hold.Store(false)
	waitUntil(t, "the store process to fail on the read-only disk", func() bool {
		h := s.Health()
		return h.ChildRestarts > restarts || h.Child == ChildRunning && !h.Healthy
	})
	t.Logf("read-only: %+v", s.Health())
	if out, err := exec.Command("mount", "-o", "remount,rw", mnt).CombinedOutput(); err != nil {
		t.Fatalf("remount rw: %v %s", err, out)
	}
	waitUntil(t, "recovery after the disk is writable", func() bool {
		h := s.Health()
		return h.Healthy && h.Child == ChildRunning && s.Flush() == nil
	})
	stopLoad()
	want := rate.Load()
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Logf("after both faults: %+v", s.Health())
	if err := s.Close(bg); err != nil {
		t.Fatal(err)
	}
	s2 := openTest(t, cfg)
	got, _ := s2.LoadMOP()
	if st := got["http/b:1"]; int64(st.LearnedRate) != want {
		t.Errorf("learned rate after the faults and a restart: %v, want %d", st.LearnedRate, want)
	}
}

// TestReadOnlyFormat3: `sluice events` opens a stopped sluice's format 3
// store in-process, read-only; while the store is open read-write it gets
// ErrLocked. After the store process was killed (a write-ahead log left)
// it reads a copy and leaves the store as it was.
func TestReadOnlyFormat3(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	s := openTest(t, cfg3(dir))
	s.SaveMOP(map[string]admission.MOPState{"http/b:1": learned(42)})
	s.Append(admission.Event{Time: t0, Kind: "mop.learned", Subject: "http b:1", Message: "a"})
	s.Append(admission.Event{Time: t0.Add(time.Second), Kind: "backend.down", Message: "b"})
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Config{Dir: dir, ReadOnly: true}, nil); !errors.Is(err, ErrLocked) {
		t.Fatalf("read-only open while running: %v, want ErrLocked", err)
	}
	for _, how := range []string{"killed", "closed"} {
		if how == "killed" {
			s.rc.mu.Lock()
			s.rc.proc.Kill() // the next one is held off: Close follows at once
			s.rc.mu.Unlock()
			waitUntil(t, "down", func() bool { return s.Health().Child == ChildDown })
		}
		s.Close(bg)
		ro := openTest(t, Config{Dir: dir, ReadOnly: true})
		got, _ := ro.LoadMOP()
		if got["http/b:1"].LearnedRate != 42 {
			t.Errorf("%s: states %+v", how, got)
		}
		evs, more, _, err := ro.Query(EventQuery{Kind: "mop.learned"})
		if err != nil || len(evs) != 1 || evs[0].Message != "a" || more {
			t.Errorf("%s: query by type: %+v %v", how, evs, err)
		}
		if evs, err := ro.Tail(5); err != nil || len(evs) != 2 {
			t.Errorf("%s: tail: %+v %v", how, evs, err)
		}
		ro.Close(bg)
		s = openTest(t, cfg3(dir))
	}
}

// TestEventsHandlerType: /events?type=&subject= reads the index, on both
// formats, with the paging fields of the plain query.
func TestEventsHandlerType(t *testing.T) {
	skipShort(t)
	for _, format := range []string{"2", "3"} {
		t.Run(format, func(t *testing.T) {
			cfg := Config{Dir: t.TempDir(), Now: func() time.Time { return t0.Add(time.Hour) }}
			if format == "3" {
				cfg = cfg3(cfg.Dir)
				cfg.Now = func() time.Time { return t0.Add(time.Hour) }
			}
			s := openTest(t, cfg)
			for i := range 5 {
				kind := "mop.learned"
				if i%2 == 1 {
					kind = "backend.down"
				}
				s.Append(admission.Event{Time: t0.Add(time.Duration(i) * time.Second), Kind: admission.EventKind(kind), Subject: "http b", Message: fmt.Sprint(i)})
			}
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
			for _, tc := range []struct{ url, want string }{
				{"/events?type=mop.learned", `0,2,4 more=false omitted=0`},
				{"/events?type=mop.learned&limit=2", `2,4 more=true omitted=0`},
				{"/events?type=mop.learned&limit=1&since=2026-11-29T15:00:01Z", `2 more=true omitted=0`},
				{"/events?type=mop.learned&limit=1&since=2026-11-29T15:00:00Z&order=newest", `4 more=true omitted=2`},
				{"/events?type=backend.down&subject=http+b", `1,3 more=false omitted=0`},
				{"/events?subject=nobody", ` more=false omitted=0`},
			} {
				rec := httptest.NewRecorder()
				s.EventsHandler().ServeHTTP(rec, httptest.NewRequest("GET", tc.url, nil))
				var page EventsPage
				if err := json.Unmarshal(rec.Body.Bytes(), &page); err != nil {
					t.Fatalf("%s: %d %s", tc.url, rec.Code, rec.Body)
				}
				var m []string
				for _, ev := range page.Events {
					m = append(m, ev.Message)
				}
				if got := fmt.Sprintf("%s more=%v omitted=%d", strings.Join(m, ","), page.More, page.Omitted); got != tc.want {
					t.Errorf("%s: %s, want %s", tc.url, got, tc.want)
				}
			}
		})
	}
}

// TestFormat3CorruptRecordStopsOpen: a stored learned state that does not
// decode stops Open with ErrCorrupt and the -data-reset hint; the store
// is not touched.
func TestFormat3CorruptRecordStopsOpen(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	s := openTest(t, cfg3(dir))
	s.Close(bg)
	k, err := openKV3(filepath.Join(dir, db3Dir), discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	wb := k.db.NewWriteBatch()
	wb.Set([]byte(mopPrefix3+"http/b:1"), []byte(`{"phase":"nonsense"}`))
	if err := wb.Flush(); err != nil {
		t.Fatal(err)
	}
	k.db.Close()
	_, err = Open(cfg3(dir), nil)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "-data-reset") || !strings.Contains(err.Error(), "http/b:1") {
		t.Fatalf("Open: %v; want ErrCorrupt naming the key and -data-reset", err)
	}
	k, err = openKV3(filepath.Join(dir, db3Dir), discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer k.db.Close()
	if _, err := k.load(); !errors.Is(err, ErrCorrupt) {
		t.Errorf("the corrupt record is gone: %v", err)
	}
}

// TestStoppedChildKilledIsNotACrash: a store process that stops answering
// (SIGSTOP here; a disk that hangs looks the same) is killed by the
// balancer at ChildCallTimeout and restarted. Its exit is reported as
// that, not as a bare "signal: killed" an operator would take for the
// OOM killer, and the write that found it says it got no answer in time.
func TestStoppedChildKilledIsNotACrash(t *testing.T) {
	skipShort(t)
	cfg := cfg3(t.TempDir())
	cfg.ChildCallTimeout = 300 * time.Millisecond
	s := openTest(t, cfg)
	s.rc.mu.Lock()
	p := s.rc.proc
	s.rc.mu.Unlock()
	if p == nil {
		t.Fatal("no store process")
	}
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	s.Append(admission.Event{Kind: "k"})
	waitUntil(t, "the stopped store process replaced", func() bool {
		h := s.Health()
		return h.ChildRestarts >= 1 && h.Child == ChildRunning
	})
	h := s.Health()
	if want := "killed by the balancer, it did not answer within 300ms"; !strings.Contains(h.ChildLastExit, want) {
		t.Errorf("last exit %q does not say %q", h.ChildLastExit, want)
	}
	if h.LastError == "" || !strings.Contains(h.LastError, "killed by the balancer") {
		t.Errorf("last error %q does not say the balancer killed it", h.LastError)
	}
}

// TestCallOutOfStepLeavesNoSocket: once a call finds the store process
// silent, the socket it closed is gone; the calls that follow (the pump
// retrying) get errChildDown, which is not reported as a fault, instead
// of "use of closed network connection" replacing the kill's reason in
// the health report. A call whose socket detach closes under it says the
// same. No clock: the peer never answers and the deadline is passed.
func TestCallOutOfStepLeavesNoSocket(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := &Store{cfg: Config{Dir: "/data", Now: func() time.Time { return now }}}
	r := &remote{s: s, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	s.rc = r
	r.journal.fd = -1
	ours, peer := unixPair(t)
	go io.Copy(io.Discard, peer) // reads the request, never answers
	r.conn = ours
	_, err := r.callTimeoutOf(&request{Op: opPing}, time.Nanosecond)
	if !errors.Is(err, os.ErrDeadlineExceeded) || !strings.Contains(err.Error(), "no answer to") {
		t.Fatalf("silent store process: %v, want the no-answer error", err)
	}
	if r.conn != nil {
		t.Fatal("the closed socket is still the store process's")
	}
	if _, err := r.callTimeoutOf(&request{Op: opPing}, time.Minute); !errors.Is(err, errChildDown) {
		t.Fatalf("call after the kill: %v, want errChildDown", err)
	}

	// detach closing the socket while a call waits on it.
	ours, peer2 := unixPair(t)
	r.conn = ours
	got := make(chan error, 1)
	go func() { _, err := r.callTimeoutOf(&request{Op: opPing}, time.Minute); got <- err }()
	buf := make([]byte, 1)
	if _, err := peer2.Read(buf); err != nil { // the request is on its way
		t.Fatal(err)
	}
	go io.Copy(io.Discard, peer2)
	ours.Close()
	if err := <-got; !errors.Is(err, errChildDown) || strings.Contains(err.Error(), "closed network connection") {
		t.Fatalf("call whose socket detach closed: %v, want errChildDown alone", err)
	}
}

// unixPair is a connected pair of Unix stream sockets, as between the
// balancer and its store process (net.Pipe's errors are not a socket's).
func unixPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "store-socket")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		conns[i] = c
	}
	return conns[0], conns[1]
}
