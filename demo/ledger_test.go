package demo

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeClock is a settable clock for expiry.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// newTestLedger returns a ledger on a fake clock with no sweeper.
func newTestLedger(t *testing.T, cfg LedgerConfig) (*Ledger, *fakeClock) {
	t.Helper()
	clk := newFakeClock()
	cfg.Now = clk.Now
	cfg.SweepInterval = -1
	l, err := NewLedger(cfg)
	if err != nil {
		t.Fatalf("NewLedger: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l, clk
}

// TestLedgerSteps walks a ledger through holds, releases and expiry at
// fixed instants and checks Used and Live after each step.
func TestLedgerSteps(t *testing.T) {
	const base = 1 << 20
	l, clk := newTestLedger(t, LedgerConfig{Max: 8 << 20, Base: base})
	steps := []struct {
		name     string
		do       func()
		wantUsed int64
		wantLive int
	}{
		{"empty", func() {}, base, 0},
		{"hold a 64KiB 10s", func() { mustHold(t, l, "a", 64<<10, 10*time.Second) }, base + 64<<10, 1},
		{"hold b 100KiB 20s", func() { mustHold(t, l, "b", 100<<10, 20*time.Second) }, base + 164<<10, 2},
		{"hold c 1MiB forever", func() { mustHold(t, l, "c", 1<<20, 0) }, base + 164<<10 + 1<<20, 3},
		{"t+9s sweep: nothing expired", func() { clk.Advance(9 * time.Second); l.Sweep() }, base + 164<<10 + 1<<20, 3},
		{"t+10s sweep: a expired", func() { clk.Advance(time.Second); l.Sweep() }, base + 100<<10 + 1<<20, 2},
		{"release b", func() {
			if !l.Release("b") {
				t.Errorf("Release(b) = false, want true")
			}
		}, base + 1<<20, 1},
		{"release b again", func() {
			if l.Release("b") {
				t.Errorf("second Release(b) = true, want false")
			}
		}, base + 1<<20, 1},
		{"t+1h sweep: c has no ttl", func() { clk.Advance(time.Hour); l.Sweep() }, base + 1<<20, 1},
		{"replace c with 4KiB", func() { mustHold(t, l, "c", 4<<10, time.Second) }, base + 4<<10, 1},
		{"t+1h+1s sweep", func() { clk.Advance(time.Second); l.Sweep() }, base, 0},
	}
	for i, s := range steps {
		s.do()
		if got := l.Used(); got != s.wantUsed {
			t.Errorf("step %d %s: Used() = %d, want %d", i, s.name, got, s.wantUsed)
		}
		if got := l.Live(); got != s.wantLive {
			t.Errorf("step %d %s: Live() = %d, want %d", i, s.name, got, s.wantLive)
		}
	}
	st := l.Stats()
	if st.Holds != 4 || st.Expired != 2 || st.OverMax != 0 || st.Refused != 0 {
		t.Errorf("Stats() = %+v, want 4 holds, 2 expired, 0 over max, 0 refused", st)
	}
}

func mustHold(t *testing.T, l *Ledger, id string, size int, ttl time.Duration) {
	t.Helper()
	if err := l.Hold(id, size, ttl); err != nil {
		t.Fatalf("Hold(%q, %d): %v", id, size, err)
	}
}

func TestLedgerHoldsSeesExpiryBeforeSweep(t *testing.T) {
	l, clk := newTestLedger(t, LedgerConfig{})
	mustHold(t, l, "s", 10, 30*time.Second)
	if !l.Holds("s") {
		t.Fatalf("Holds(s) = false right after Hold")
	}
	clk.Advance(30 * time.Second)
	if l.Holds("s") {
		t.Errorf("Holds(s) = true after its ttl, want false")
	}
	if got := l.Live(); got != 1 {
		t.Errorf("Live() = %d before the sweep, want 1", got)
	}
	if l.Holds("unknown") {
		t.Errorf("Holds(unknown) = true")
	}
}

// TestLedgerOverMaxThenLimit: holds past Max succeed and are counted; holds
// past Limit fail with ErrExhausted and change nothing.
func TestLedgerOverMaxThenLimit(t *testing.T) {
	const kib = 1 << 10
	l, _ := newTestLedger(t, LedgerConfig{Max: 10 * kib, Base: 2 * kib, Limit: 16 * kib})
	tests := []struct {
		id          string
		wantErr     error
		wantUsed    int64
		wantOverMax uint64
	}{
		{"s1", nil, 6 * kib, 0},
		{"s2", nil, 10 * kib, 0}, // exactly Max is not over it
		{"s3", nil, 14 * kib, 1},
		{"s4", ErrExhausted, 14 * kib, 1}, // 18 KiB > Limit
		{"s5", ErrExhausted, 14 * kib, 1},
	}
	for _, tc := range tests {
		err := l.Hold(tc.id, 4*kib, time.Minute)
		if !errors.Is(err, tc.wantErr) {
			t.Errorf("Hold(%s) = %v, want %v", tc.id, err, tc.wantErr)
		}
		st := l.Stats()
		if st.Used != tc.wantUsed || st.OverMax != tc.wantOverMax {
			t.Errorf("after %s: used %d over max %d, want %d and %d", tc.id, st.Used, st.OverMax, tc.wantUsed, tc.wantOverMax)
		}
	}
	if st := l.Stats(); st.Refused != 2 || st.Live != 3 {
		t.Errorf("Stats() = %+v, want 2 refused and 3 live", st)
	}
	// Replacing a held id with one of the same size fits even at the limit.
	if err := l.Hold("s3", 4*kib, time.Minute); err != nil {
		t.Errorf("replacing s3 at the limit: %v", err)
	}
	l.Release("s1")
	if err := l.Hold("s4", 4*kib, time.Minute); err != nil {
		t.Errorf("Hold(s4) after a release: %v", err)
	}
}

func TestLedgerConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  LedgerConfig
		want string
	}{
		{"negative max", LedgerConfig{Max: -1}, "max memory must be positive"},
		{"negative base", LedgerConfig{Base: -1}, "base memory must not be negative"},
		{"limit below max", LedgerConfig{Max: 10, Limit: 5}, "below max memory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := NewLedger(tc.cfg)
			if err == nil {
				l.Close()
				t.Fatalf("NewLedger(%+v) = nil error, want %q", tc.cfg, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewLedger(%+v) = %q, want it to contain %q", tc.cfg, err, tc.want)
			}
		})
	}
	l, _ := newTestLedger(t, LedgerConfig{})
	if err := l.Hold("x", -1, 0); err == nil {
		t.Errorf("Hold with a negative size: nil error")
	}
}

// TestLedgerConcurrentLimit hammers a ledger from several goroutines: the
// Limit is exact, and after every release the books are back at Base.
func TestLedgerConcurrentLimit(t *testing.T) {
	const (
		workers = 8
		each    = 50
		size    = 4 << 10
		fit     = 100 // holds that fit under the limit
	)
	l, _ := newTestLedger(t, LedgerConfig{Max: fit * size, Base: 0, Limit: fit * size})
	var wg sync.WaitGroup
	errs := make([]int, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if err := l.Hold(fmt.Sprintf("w%d-%d", w, i), size, time.Minute); err != nil {
					errs[w]++
				}
			}
		}()
	}
	wg.Wait()
	refused := 0
	for _, n := range errs {
		refused += n
	}
	if got, want := l.Live(), fit; got != want {
		t.Errorf("Live() = %d, want %d", got, want)
	}
	if got, want := refused, workers*each-fit; got != want {
		t.Errorf("refused %d holds, want %d", got, want)
	}
	if got, want := l.Used(), int64(fit*size); got != want {
		t.Errorf("Used() = %d, want %d", got, want)
	}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				l.Release(fmt.Sprintf("w%d-%d", w, i))
			}
		}()
	}
	wg.Wait()
	if l.Used() != 0 || l.Live() != 0 {
		t.Errorf("after releasing everything: used %d live %d, want 0 and 0", l.Used(), l.Live())
	}
}

func TestLedgerClose(t *testing.T) {
	l, err := NewLedger(LedgerConfig{Base: 100})
	if err != nil {
		t.Fatal(err)
	}
	mustHold(t, l, "a", 1<<10, time.Hour)
	mustHold(t, l, "b", 1<<10, 0)
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if l.Used() != 100 || l.Live() != 0 {
		t.Errorf("after Close: used %d live %d, want 100 and 0", l.Used(), l.Live())
	}
	if err := l.Hold("c", 1, 0); !errors.Is(err, ErrClosed) {
		t.Errorf("Hold after Close = %v, want ErrClosed", err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestLedgerSweeperRuns checks that the background sweeper releases an
// expired hold, without timing assertions: the clock is fake and the test
// polls a bounded number of times.
func TestLedgerSweeperRuns(t *testing.T) {
	clk := newFakeClock()
	l, err := NewLedger(LedgerConfig{Now: clk.Now, SweepInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	mustHold(t, l, "a", 1<<10, time.Second)
	clk.Advance(time.Second)
	for i := 0; i < 5000 && l.Live() != 0; i++ {
		time.Sleep(time.Millisecond)
	}
	if l.Live() != 0 {
		t.Fatalf("Live() = %d: the sweeper never released the expired hold", l.Live())
	}
}

// TestLedgerMemoryIsResident checks that held memory shows in the
// process's resident set and leaves it on release (mapped memory is
// unmapped at once).
func TestLedgerMemoryIsResident(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/self/statm")
	}
	const size = 32 << 20
	l, _ := newTestLedger(t, LedgerConfig{Max: 2 * size})
	before := rss(t)
	mustHold(t, l, "big", size, 0)
	held := rss(t)
	if grew := held - before; grew < size*9/10 {
		t.Errorf("RSS grew by %d bytes holding %d, want at least 90%%", grew, size)
	}
	l.Release("big")
	if shrank := held - rss(t); shrank < size*9/10 {
		t.Errorf("RSS shrank by %d bytes releasing %d, want at least 90%%", shrank, size)
	}
}

func rss(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Skipf("read statm: %v", err)
	}
	f := strings.Fields(string(b))
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		t.Fatalf("parse statm %q: %v", b, err)
	}
	return pages * int64(os.Getpagesize())
}

func TestLedgerGoHeap(t *testing.T) {
	l, _ := newTestLedger(t, LedgerConfig{GoHeap: true})
	mustHold(t, l, "a", 3*pageSize+1, 0)
	h, _ := l.lookup("a")
	if h.blk.mapped || len(h.blk.b) != 3*pageSize+1 {
		t.Errorf("GoHeap hold: mapped %v len %d, want false and %d", h.blk.mapped, len(h.blk.b), 3*pageSize+1)
	}
	for i := 0; i < len(h.blk.b); i += pageSize {
		if h.blk.b[i] != 1 {
			t.Fatalf("page at %d not touched", i)
		}
	}
}

func BenchmarkLedgerHoldRelease(b *testing.B) {
	l, err := NewLedger(LedgerConfig{SweepInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	b.ReportAllocs()
	for b.Loop() {
		l.Hold("x", DefaultSessionBytes, time.Minute)
		l.Release("x")
	}
}
