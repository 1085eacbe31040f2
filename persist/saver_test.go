package persist

import (
	"bufio"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicelb/sluice/admission"
)

// counterStates returns a states function whose n-th call gives every key
// an allowed rate of n.
func counterStates(keys []string, calls *atomic.Int64, onCall func(n int64)) func() map[string]admission.MOPState {
	return func() map[string]admission.MOPState {
		n := calls.Add(1)
		m := make(map[string]admission.MOPState, len(keys))
		for _, k := range keys {
			m[k] = admission.MOPState{Phase: admission.Discovery, AllowedRate: float64(n), UpdatedAt: t0}
		}
		if onCall != nil {
			onCall(n)
		}
		return m
	}
}

func TestSaverSavesAtClose(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, Config{Dir: dir, Interval: time.Hour})
	var calls atomic.Int64
	sv, err := s.NewSaver(counterStates([]string{"http/a:1"}, &calls, nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := sv.Close(bg); err != nil {
		t.Fatal(err)
	}
	if err := sv.Close(bg); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	got, err := s.LoadMOP()
	if err != nil {
		t.Fatal(err)
	}
	if got["http/a:1"].AllowedRate != float64(calls.Load()) || calls.Load() != 1 {
		t.Fatalf("after Close: state %+v, %d calls; want the final save of call 1", got, calls.Load())
	}
}

func TestStoreCloseStopsSavers(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir, Interval: time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	if _, err := s.NewSaver(counterStates([]string{"sip/b:5060"}, &calls, nil)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(bg); err != nil {
		t.Fatal(err)
	}
	s = openTest(t, Config{Dir: dir})
	got, err := s.LoadMOP()
	if err != nil {
		t.Fatal(err)
	}
	if got["sip/b:5060"].AllowedRate != 1 {
		t.Fatalf("after Store.Close: %+v; want the Saver's final save", got)
	}
}

func TestSaverSavesEveryInterval(t *testing.T) {
	s := openTest(t, Config{Dir: t.TempDir(), Interval: 10 * time.Millisecond})
	var calls atomic.Int64
	saved := make(chan int64, 100)
	sv, err := s.NewSaver(counterStates([]string{"http/a:1"}, &calls, func(n int64) {
		select {
		case saved <- n:
		default:
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer sv.Close(bg)
	// The third call happens only after the second state was saved.
	deadline := time.After(30 * time.Second)
	for n := int64(0); n < 3; {
		select {
		case n = <-saved:
		case <-deadline:
			t.Fatal("the Saver did not run three times in 30s")
		}
	}
	got, err := s.LoadMOP()
	if err != nil {
		t.Fatal(err)
	}
	if r := got["http/a:1"].AllowedRate; r < 2 {
		t.Fatalf("allowed rate %g after three ticks; want at least 2", r)
	}
}

const crashEnv = "SLUICE_PERSIST_CRASH_DIR"

var crashKeys = []string{"http/127.0.0.1:18081", "http/127.0.0.1:18082", "sip/127.0.0.1:5071"}

// dirDigest describes the files of dir: names, sizes and a hash of their
// contents, ignoring LOCK.
func dirDigest(t *testing.T, dir string) string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range entries {
		if e.Name() == "LOCK" {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s:%d:%x ", e.Name(), len(data), sha256.Sum256(data))
	}
	return b.String()
}

// TestMain lets the crash test re-execute the test binary as the process
// that gets killed.
func TestMain(m *testing.M) {
	if dir := os.Getenv(crashEnv); dir != "" {
		crashChild(dir)
		return
	}
	if dir := os.Getenv(tmpfsEnv); dir != "" {
		tmpfsChild(dir)
		return
	}
	if dir := os.Getenv(storeChildEnv); dir != "" {
		storeChildMain(dir)
		return
	}
	if dir := os.Getenv(journalParentEnv); dir != "" {
		journalParent(dir)
		return
	}
	// Close must stop every goroutine, ours and badger's.
	goleak.VerifyTestMain(m)
}

// crashChild saves states through a Saver every 10ms and prints the
// number of each call of the states function, until it is killed.
func crashChild(dir string) {
	s, err := Open(Config{Dir: dir, Interval: 10 * time.Millisecond}, nil)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	var calls atomic.Int64
	_, err = s.NewSaver(counterStates(crashKeys, &calls, func(n int64) {
		fmt.Println("call", n)
	}))
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	for i := 0; ; i++ {
		s.Append(admission.Event{Kind: admission.EventMOPLearned, Subject: "crash", Message: strconv.Itoa(i)})
		time.Sleep(time.Millisecond)
	}
}

// TestCrashKeepsSavedStates kills a process that is saving states with
// SIGKILL and checks that what it saved before its last interval is there
// after reopening: the state of call n is saved (and synced) before call
// n+1 starts, so seeing "call n" proves that call n-1 is on disk.
func TestCrashKeepsSavedStates(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a subprocess")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	var seen int64
	for seen < 20 && lines.Scan() {
		line := lines.Text()
		if n, ok := strings.CutPrefix(line, "call "); ok {
			seen, _ = strconv.ParseInt(n, 10, 64)
		} else {
			t.Fatalf("child: %s", line)
		}
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	cmd.Wait()
	if seen < 20 {
		t.Fatalf("child stopped after call %d: %v", seen, lines.Err())
	}

	// A read-only open (sluice events) of the crashed store leaves it as
	// it is.
	before := dirDigest(t, dir)
	ro := openTest(t, Config{Dir: dir, ReadOnly: true})
	roStates, err := ro.LoadMOP()
	if err != nil {
		t.Fatalf("read-only open after kill -9: %v", err)
	}
	roEvents, err := ro.Events(time.Time{}, 0)
	if err != nil || len(roEvents) == 0 {
		t.Fatalf("read-only Events after kill -9 = %d events, %v", len(roEvents), err)
	}
	if err := ro.Close(bg); err != nil {
		t.Fatal(err)
	}
	if after := dirDigest(t, dir); after != before {
		t.Fatalf("read-only open changed the store:\n%s\n%s", before, after)
	}

	s := openTest(t, Config{Dir: dir})
	got, err := s.LoadMOP()
	if err != nil {
		t.Fatal(err)
	}
	checkStates(t, roStates, got)
	if len(got) != len(crashKeys) {
		t.Fatalf("after kill -9: %d states %v, want %d", len(got), got, len(crashKeys))
	}
	rate := got[crashKeys[0]].AllowedRate
	for _, k := range crashKeys {
		if got[k].AllowedRate != rate {
			t.Errorf("state %s has rate %g, %s has %g: one save must be one transaction",
				k, got[k].AllowedRate, crashKeys[0], rate)
		}
	}
	if rate < float64(seen-1) {
		t.Errorf("after kill -9 at call %d the saved rate is %g; want at least %d", seen, rate, seen-1)
	}
	evs, err := s.Events(time.Time{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("killed at call %d: reopened with rate %g and %d events", seen, rate, len(evs))
}
