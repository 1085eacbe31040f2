package persist

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/internal/testenv"
)

// faultFS is the operating system with injected faults: while fail is set,
// every open for writing and every rename fails with it; while hang is set,
// writes block until it is closed.
type faultFS struct {
	osFS
	fail atomic.Pointer[error]
	hang atomic.Pointer[chan struct{}]
}

func (f *faultFS) setFail(err error) {
	if err == nil {
		f.fail.Store(nil)
		return
	}
	f.fail.Store(&err)
}

func (f *faultFS) err() error {
	if p := f.fail.Load(); p != nil {
		return *p
	}
	return nil
}

func (f *faultFS) OpenFile(name string, flag int, perm os.FileMode) (writeFile, error) {
	if err := f.err(); err != nil {
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	w, err := f.osFS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return hangFile{w, f}, nil
}

func (f *faultFS) Rename(from, to string) error {
	if err := f.err(); err != nil {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
	}
	return f.osFS.Rename(from, to)
}

type hangFile struct {
	writeFile
	f *faultFS
}

func (h hangFile) Write(p []byte) (int, error) {
	if c := h.f.hang.Load(); c != nil {
		<-*c
	}
	return h.writeFile.Write(p)
}

// logBuffer collects log lines for assertions.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.buf.String(), s)
}

func kinds(evs []admission.Event) map[admission.EventKind]int {
	m := map[admission.EventKind]int{}
	for _, e := range evs {
		m[e.Kind]++
	}
	return m
}

// TestInjectedWriteFailureIsReportedAndRecovers: a disk that refuses
// writes (ENOSPC) does not lose learned states or events: they stay in
// memory, the failure is logged once and then as a count per
// FaultLogInterval, counted in Health, written to the event log as
// persist.failing; when the disk takes writes again everything is saved
// and persist.recovered follows.
func TestInjectedWriteFailureIsReportedAndRecovers(t *testing.T) {
	dir := t.TempDir()
	ffs := &faultFS{}
	clk := newClock(t0)
	var logs logBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	cfg := Config{Dir: dir, SweepInterval: -1, Interval: time.Hour, FaultLogInterval: time.Minute, Now: clk.now, fs: ffs}
	s, err := Open(cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(bg) })
	if err := s.Save("http/a:1", learned(10)); err != nil {
		t.Fatal(err)
	}
	appendAll(t, s, ev(t0, "before"))

	ffs.setFail(syscall.ENOSPC)
	for i := range 5 {
		err := s.Save("http/a:1", learned(float64(11+i)))
		if !errors.Is(err, ErrUnwritable) || !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("Save on a full disk: %v; want ErrUnwritable wrapping ENOSPC", err)
		}
	}
	s.Append(ev(t0.Add(time.Second), "during"))
	if err := s.Flush(); !errors.Is(err, ErrUnwritable) {
		t.Fatalf("Flush on a full disk: %v; want ErrUnwritable", err)
	}
	h := s.Health()
	if h.Healthy || h.SaveErrors < 6 || !strings.Contains(h.LastError, "no space") || h.FailingSince.IsZero() || h.EventsPending == 0 {
		t.Fatalf("Health while failing = %+v", h)
	}
	if got, _ := s.LoadMOP(); got["http/a:1"].LearnedRate != 15 {
		t.Errorf("LoadMOP while failing: %+v; want the last state kept in memory", got)
	}
	if n := logs.count("data directory cannot be written"); n != 1 {
		t.Errorf("first-failure log lines: %d, want 1\n%s", n, logs.buf.String())
	}
	if n := logs.count("still cannot be written"); n != 0 {
		t.Errorf("summary logged before FaultLogInterval passed: %d", n)
	}
	clk.set(t0.Add(time.Minute))
	s.Save("http/a:1", learned(16))
	if n := logs.count("still cannot be written"); n != 1 || logs.count("failures=") != 1 {
		t.Errorf("after FaultLogInterval: %d summary lines, want 1 with a count\n%s", n, logs.buf.String())
	}
	// The event log shows the failure and the waiting events in memory.
	evs, err := s.Events(time.Time{}, 0)
	if k := kinds(evs); err != nil || k[EventFailing] != 1 || len(evs) < 3 {
		t.Fatalf("Events while failing = %v, %v; want before, during and one %s", evs, err, EventFailing)
	}

	ffs.setFail(nil)
	if err := s.Save("http/a:1", learned(20)); err != nil {
		t.Fatalf("Save after the disk recovered: %v", err)
	}
	s.Append(ev(t0.Add(2*time.Second), "after"))
	if err := s.Flush(); err != nil {
		t.Fatalf("Flush after the disk recovered: %v", err)
	}
	s.Flush() // the persist.recovered event, appended by that write
	if h := s.Health(); !h.Healthy || h.EventsPending != 0 || !h.FailingSince.IsZero() {
		t.Fatalf("Health after recovery = %+v", h)
	}
	if n := logs.count("writable again"); n != 1 {
		t.Errorf("recovery log lines: %d, want 1", n)
	}
	if err := s.Close(bg); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, Config{Dir: dir, SweepInterval: -1})
	got, _ := s.LoadMOP()
	checkStates(t, got, map[string]admission.MOPState{"http/a:1": learned(20)})
	evs, err = s.Events(time.Time{}, 0)
	k := kinds(evs)
	if err != nil || k[EventFailing] != 1 || k[EventRecovered] != 1 {
		t.Fatalf("events on disk after recovery: %v, %v", evs, err)
	}
	for _, want := range []string{"before", "during", "after"} {
		if !strings.Contains(fmt.Sprint(messages(evs)), want) {
			t.Errorf("event %q lost: %q", want, messages(evs))
		}
	}
}

// TestCloseReturnsByDeadlineWhenWritesHang: a disk that never answers
// (writes block) does not hold up Close beyond its context.
func TestCloseReturnsByDeadlineWhenWritesHang(t *testing.T) {
	ffs := &faultFS{}
	s, err := Open(Config{Dir: t.TempDir(), Interval: 10 * time.Millisecond, fs: ffs}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	if _, err := s.NewSaver(counterStates([]string{"http/a:1"}, &calls, nil)); err != nil {
		t.Fatal(err)
	}
	hang := make(chan struct{})
	ffs.hang.Store(&hang)
	c0 := calls.Load()
	s.Append(ev(t0, "stuck"))
	waitUntil(t, "a save to be stuck", func() bool { return calls.Load() > c0 })

	ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Close(ctx) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Close with hanging writes: %v; want DeadlineExceeded", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return after its deadline")
	}
	// Let the disk answer so the goroutines end (goleak checks).
	ffs.hang.Store(nil)
	close(hang)
	if err := s.Close(bg); err != nil {
		t.Errorf("Close once the disk answers: %v", err)
	}
}

// waitUntil polls cond every 5ms, failing after 30s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

// TestDataDirRemovedWhileSaving: the directory vanishing (what a dead
// disk looks like) makes saves fail, not the process; made again, it gets
// the store back (format file, learned states, events).
func TestDataDirRemovedWhileSaving(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	s := openTest(t, Config{Dir: dir, Interval: 10 * time.Millisecond, SweepInterval: -1})
	var calls atomic.Int64
	if _, err := s.NewSaver(counterStates([]string{"http/a:1"}, &calls, nil)); err != nil {
		t.Fatal(err)
	}
	s.Append(ev(t0, "before"))
	// Renamed away in one step (RemoveAll would race with the saves),
	// then removed.
	if err := os.Rename(dir, dir+".gone"); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir + ".gone"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the store to notice", func() bool { return !s.Healthy() })
	s.Append(ev(t0.Add(time.Second), "while removed"))
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "saving to resume", func() bool { return s.Healthy() && s.Health().EventsPending == 0 })
	atRecovery := calls.Load()
	if err := s.Close(bg); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, Config{Dir: dir, SweepInterval: -1})
	got, _ := s.LoadMOP()
	if got["http/a:1"].AllowedRate < float64(atRecovery) {
		t.Errorf("after the directory came back: state %+v, want the save of call %d or later", got, atRecovery)
	}
	evs, err := s.Events(time.Time{}, 0)
	if k := kinds(evs); err != nil || k[EventFailing] != 1 || k[EventRecovered] != 1 ||
		!strings.Contains(fmt.Sprint(messages(evs)), "while removed") {
		t.Errorf("events after the directory came back: %v, %v", evs, err)
	}
}

// tmpfsEnv names the directory of the tmpfs child (see tmpfsChild).
const tmpfsEnv = "SLUICE_PERSIST_TMPFS_CHILD"

// tmpfsChild saves states every 10ms and appends an event every ms into
// the store in dir, printing "health <healthy> <errors> <call>" every
// 20ms, until its stdin closes; then it closes the store with a 5s
// deadline and prints "closed <err>".
func tmpfsChild(dir string) {
	s, err := Open(Config{Dir: dir, Interval: 10 * time.Millisecond}, nil)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	var calls atomic.Int64
	if _, err := s.NewSaver(counterStates(crashKeys, &calls, nil)); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	stdin := make(chan struct{})
	go func() {
		bufio.NewReader(os.Stdin).ReadString('\n')
		close(stdin)
	}()
	tick := time.NewTicker(time.Millisecond)
	for i := 0; ; i++ {
		select {
		case <-stdin:
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := s.Close(ctx)
			cancel()
			fmt.Println("closed", err)
			os.Exit(0)
		case <-tick.C:
		}
		s.Append(admission.Event{Kind: admission.EventMOPLearned, Subject: "tmpfs", Message: strings.Repeat("x", 200) + strconv.Itoa(i)})
		if i%20 == 0 {
			fmt.Println("health", s.Healthy(), s.SaveErrors(), calls.Load())
		}
	}
}

// TestTmpfsFullAndReadOnly runs a store on a 16 MiB tmpfs in a child
// process and fills the filesystem, then makes it read-only: the child
// must survive both (Badger died of SIGBUS here), report the failure, and
// resume saving by itself when space is freed and the filesystem is
// writable again. Needs root to mount.
func TestTmpfsFullAndReadOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a subprocess")
	}
	if os.Geteuid() != 0 {
		testenv.Missing(t, "needs root to mount a tmpfs (run the tests as root to cover a filesystem that fills up)")
	}
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", mnt).CombinedOutput(); err != nil {
		testenv.Missing(t, fmt.Sprintf("cannot mount a tmpfs: %v %s", err, out))
	}
	// CI's output says that the full-disk regression ran.
	fmt.Printf("TestTmpfsFullAndReadOnly: running on a 16 MiB tmpfs at %s\n", mnt)
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", mnt, err, out)
		}
	})
	dir := filepath.Join(mnt, "data")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), tmpfsEnv+"="+dir)
	stdin, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	var stderr logBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := bufio.NewScanner(out)
	var last string
	// next reads health lines until want (healthy or not) has been seen
	// n times in a row, and returns the save-call count of the last.
	next := func(what string, want bool, n int) int64 {
		t.Helper()
		seen := 0
		for lines.Scan() {
			last = lines.Text()
			f := strings.Fields(last)
			if len(f) != 4 || f[0] != "health" {
				t.Fatalf("child: %s", last)
			}
			if f[1] == strconv.FormatBool(want) {
				if seen++; seen == n {
					c, _ := strconv.ParseInt(f[3], 10, 64)
					return c
				}
			} else {
				seen = 0
			}
		}
		t.Fatalf("child ended while waiting for %s (last line %q): %v\nstderr: %s", what, last, cmd.Wait(), stderr.buf.String())
		return 0
	}
	next("a healthy start", true, 3)

	// Fill the filesystem.
	filler := filepath.Join(mnt, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	for i := 0; i < 1000; i++ {
		if _, err := f.Write(chunk); err != nil {
			break
		}
	}
	f.Close()
	next("the full disk to be noticed", false, 1)
	next("the child to keep running on a full disk", false, 20)
	os.Remove(filler)
	before := next("saving to resume after space was freed", true, 5)

	// Read-only (root ignores permissions, so remount instead of chmod).
	remount := func(mode string) {
		t.Helper()
		var out []byte
		var err error
		for i := 0; i < 100; i++ { // EBUSY while a write is under way
			if out, err = exec.Command("mount", "-o", "remount,"+mode, mnt).CombinedOutput(); err == nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("remount %s %s: %v %s", mode, mnt, err, out)
	}
	remount("ro")
	next("the read-only filesystem to be noticed", false, 5)
	remount("rw")
	after := next("saving to resume after the remount", true, 5)

	fmt.Fprintln(stdin)
	for lines.Scan() {
		if last = lines.Text(); strings.HasPrefix(last, "closed") {
			break
		}
	}
	if err := cmd.Wait(); err != nil || last != "closed <nil>" {
		t.Fatalf("child exit: %v, last line %q, stderr %s", err, last, stderr.buf.String())
	}
	s := openTest(t, Config{Dir: dir, ReadOnly: true})
	got, err := s.LoadMOP()
	if err != nil || got[crashKeys[0]].AllowedRate < float64(after) {
		t.Fatalf("after the faults: %+v, %v; want the save of call %d or later (%d before the remount)", got, err, after, before)
	}
	evs, err := s.Events(time.Time{}, 0)
	if k := kinds(evs); err != nil || k[EventFailing] < 1 || k[EventRecovered] < 1 {
		t.Errorf("event log after the faults: %d events, %v, kinds %v", len(evs), err, k)
	}
	if err := s.Close(bg); err != nil {
		t.Fatal(err)
	}
}
