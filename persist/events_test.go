package persist

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sluicelb/sluice/admission"
)

// clock is a settable clock for Config.Now.
type clock struct{ ns atomic.Int64 }

func newClock(t time.Time) *clock { c := &clock{}; c.set(t); return c }
func (c *clock) set(t time.Time)  { c.ns.Store(t.UnixNano()) }
func (c *clock) now() time.Time   { return time.Unix(0, c.ns.Load()).UTC() }

func ev(at time.Time, msg string) admission.Event {
	return admission.Event{Time: at, Kind: admission.EventConfigWarning, Subject: "test", Message: msg}
}

func appendAll(t *testing.T, s *Store, evs ...admission.Event) {
	t.Helper()
	for _, e := range evs {
		s.Append(e)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
}

func messages(evs []admission.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Message
	}
	return out
}

func checkMessages(t *testing.T, what string, evs []admission.Event, err error, want ...string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	got := messages(evs)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s = %q, want %q", what, got, want)
	}
}

func TestEventsOrderSinceLimit(t *testing.T) {
	s := openTest(t, Config{Dir: t.TempDir(), SweepInterval: -1})
	sec := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Second) }
	// Appended out of time order; "c1" and "c2" share an instant and keep
	// their append order.
	appendAll(t, s, ev(sec(3), "d"), ev(sec(1), "b"), ev(sec(2), "c1"), ev(sec(2), "c2"), ev(sec(0), "a"))

	evs, err := s.Events(time.Time{}, 0)
	checkMessages(t, "Events(all)", evs, err, "a", "b", "c1", "c2", "d")
	evs, err = s.Events(sec(2), 0)
	checkMessages(t, "Events(since 2s)", evs, err, "c1", "c2", "d")
	evs, err = s.Events(sec(1), 2)
	checkMessages(t, "Events(since 1s, 2)", evs, err, "b", "c1")
	evs, err = s.Events(sec(4), 10)
	checkMessages(t, "Events(since 4s)", evs, err)
	evs, err = s.Tail(2)
	checkMessages(t, "Tail(2)", evs, err, "c2", "d")
	evs, err = s.Tail(10)
	checkMessages(t, "Tail(10)", evs, err, "a", "b", "c1", "c2", "d")

	if !evs[0].Time.Equal(sec(0)) || evs[0].Kind != admission.EventConfigWarning || evs[0].Subject != "test" {
		t.Errorf("first event = %+v; fields did not survive the round trip", evs[0])
	}
}

func TestEventZeroTimeGetsNow(t *testing.T) {
	c := newClock(t0)
	s := openTest(t, Config{Dir: t.TempDir(), SweepInterval: -1, Now: c.now})
	appendAll(t, s, admission.Event{Kind: admission.EventMemoryState, Message: "normal -> low"})
	evs, err := s.Events(time.Time{}, 0)
	if err != nil || len(evs) != 1 || !evs[0].Time.Equal(t0) {
		t.Fatalf("Events = %+v, %v; want one event at %v", evs, err, t0)
	}
}

func TestEventSinkConcurrentAppendsNeverCollide(t *testing.T) {
	const goroutines, each = 8, 200
	s := openTest(t, Config{Dir: t.TempDir(), SweepInterval: -1, EventsBuffer: goroutines * each})
	sink := s.EventSink()
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				sink(ev(t0, fmt.Sprint(g, "/", i))) // all at the same instant
			}
		})
	}
	wg.Wait()
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	evs, err := s.Events(time.Time{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != goroutines*each || s.EventsDropped() != 0 {
		t.Fatalf("stored %d events, dropped %d; want %d, 0", len(evs), s.EventsDropped(), goroutines*each)
	}
	seen := make(map[string]bool)
	for _, e := range evs {
		seen[e.Message] = true
	}
	if len(seen) != goroutines*each {
		t.Fatalf("%d distinct events, want %d", len(seen), goroutines*each)
	}
}

func TestEventsSurviveReopen(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Config{Dir: dir, SweepInterval: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Append(ev(t0, "before"))
	if err := s.Close(bg); err != nil { // Close writes what is queued
		t.Fatal(err)
	}
	s = openTest(t, Config{Dir: dir, SweepInterval: -1})
	appendAll(t, s, ev(t0, "after")) // same instant: the sequence continues
	evs, err := s.Events(time.Time{}, 0)
	checkMessages(t, "Events after reopen", evs, err, "before", "after")
}

func TestSweepRetention(t *testing.T) {
	c := newClock(t0)
	s := openTest(t, Config{Dir: t.TempDir(), SweepInterval: -1, Now: c.now,
		EventsRetention: time.Hour, EventsMax: 3})
	minute := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Minute) }
	appendAll(t, s, ev(minute(-90), "old1"), ev(minute(-61), "old2"), ev(minute(-60), "edge"), ev(minute(-30), "a"))

	// By age: older than one hour goes; exactly one hour old stays.
	n, err := s.SweepEvents()
	if err != nil || n != 2 {
		t.Fatalf("SweepEvents = %d, %v; want 2", n, err)
	}
	evs, err := s.Events(time.Time{}, 0)
	checkMessages(t, "after age sweep", evs, err, "edge", "a")

	// By count: the oldest beyond EventsMax go.
	appendAll(t, s, ev(minute(-20), "b"), ev(minute(-10), "c"))
	n, err = s.SweepEvents()
	if err != nil || n != 1 {
		t.Fatalf("SweepEvents = %d, %v; want 1", n, err)
	}
	evs, err = s.Events(time.Time{}, 0)
	checkMessages(t, "after count sweep", evs, err, "a", "b", "c")

	// Time passes: everything is over an hour old.
	c.set(minute(100))
	if n, err = s.SweepEvents(); err != nil || n != 3 {
		t.Fatalf("SweepEvents = %d, %v; want 3", n, err)
	}
	if n, err = s.SweepEvents(); err != nil || n != 0 {
		t.Fatalf("SweepEvents on an empty log = %d, %v; want 0", n, err)
	}
}

func TestSweepLimitsOff(t *testing.T) {
	c := newClock(t0)
	s := openTest(t, Config{Dir: t.TempDir(), SweepInterval: -1, Now: c.now,
		EventsRetention: -1, EventsMax: -1})
	appendAll(t, s, ev(t0.AddDate(-1, 0, 0), "a year ago"), ev(t0, "now"))
	if n, err := s.SweepEvents(); err != nil || n != 0 {
		t.Fatalf("SweepEvents with no limits = %d, %v; want 0", n, err)
	}
}

func TestBackgroundSweep(t *testing.T) {
	c := newClock(t0)
	s := openTest(t, Config{Dir: t.TempDir(), Now: c.now, EventsRetention: time.Hour,
		SweepInterval: 10 * time.Millisecond})
	appendAll(t, s, ev(t0.Add(-2*time.Hour), "old"), ev(t0, "new"))
	deadline := time.Now().Add(30 * time.Second)
	for {
		evs, err := s.Events(time.Time{}, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 1 && evs[0].Message == "new" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the background sweep did not remove the old event: %q", messages(evs))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestLongEventIsCut(t *testing.T) {
	s := openTest(t, Config{Dir: t.TempDir(), SweepInterval: -1})
	long := strings.Repeat("é", 1<<20) // 2 MiB: more than one transaction holds
	appendAll(t, s, ev(t0, long))
	evs, err := s.Events(time.Time{}, 0)
	if err != nil || len(evs) != 1 {
		t.Fatalf("Events = %d events, %v; want 1", len(evs), err)
	}
	m := evs[0].Message
	if len(m) > maxText+len("…") || !strings.HasPrefix(long, strings.TrimSuffix(m, "…")) || !utf8.ValidString(m) {
		t.Fatalf("stored message of %d bytes (valid UTF-8 %v); want at most %d, a prefix", len(m), utf8.ValidString(m), maxText)
	}
}

func TestEventKeysSortByTime(t *testing.T) {
	times := []time.Time{
		time.Date(1969, 1, 1, 0, 0, 0, 0, time.UTC), // clamps to 0
		time.Unix(0, 0),
		t0,
		t0.Add(time.Nanosecond),
		time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC), // clamps to MaxInt64
	}
	prev := []byte(nil)
	for i, tm := range times {
		k := eventKey(tm, 0)
		if prev != nil && string(k) < string(prev) {
			t.Errorf("key of %v sorts before key of %v", tm, times[i-1])
		}
		if _, _, err := decodeEventKey(k); err != nil {
			t.Errorf("decodeEventKey(eventKey(%v)): %v", tm, err)
		}
		prev = k
	}
	if string(eventKey(t0, 2)) <= string(eventKey(t0, 1)) {
		t.Error("sequence does not order events at the same instant")
	}
}

// BenchmarkAppend measures Append and the writer behind it: it waits for
// the writer every 256 events, so nothing is dropped.
func BenchmarkAppend(b *testing.B) {
	s, err := Open(Config{Dir: b.TempDir(), SweepInterval: -1}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close(bg)
	e := ev(t0, "backend 127.0.0.1:18081 learned 120.5/s")
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		s.Append(e)
		if i++; i%256 == 0 {
			s.Flush()
		}
	}
	s.Flush()
	b.ReportMetric(float64(s.EventsDropped()), "dropped")
}

// BenchmarkOpenFullLog measures Open (which decodes every record) with
// DefaultEventsMax events stored.
func BenchmarkOpenFullLog(b *testing.B) {
	dir := b.TempDir()
	s, err := Open(Config{Dir: dir, SweepInterval: -1, EventsBuffer: DefaultEventsMax}, nil)
	if err != nil {
		b.Fatal(err)
	}
	for i := range DefaultEventsMax {
		s.Append(ev(t0.Add(time.Duration(i)*time.Millisecond), "backend 127.0.0.1:18081 learned 120.5/s"))
	}
	if err := s.Close(bg); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		s, err := Open(Config{Dir: dir, SweepInterval: -1}, nil)
		if err != nil {
			b.Fatal(err)
		}
		s.Close(bg)
	}
}

func BenchmarkSaveMOP(b *testing.B) {
	s, err := Open(Config{Dir: b.TempDir(), SweepInterval: -1}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close(bg)
	states := make(map[string]admission.MOPState)
	for i := range 16 {
		states[MOPKey("http", fmt.Sprintf("10.0.0.%d:8080", i))] = learned(100)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := s.SaveMOP(states); err != nil {
			b.Fatal(err)
		}
	}
}
