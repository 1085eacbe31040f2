package admission

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func leasedMeter(t *testing.T, rc RuleConfig, wait time.Duration) (*Meter, *Lease) {
	t.Helper()
	m, err := NewMeter(rc, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	l := NewLease(wait, nil)
	m.SetLease(l)
	return m, l
}

// TestLeaseSteps walks a reject rule through grants, spending, expiry and
// drain at fixed instants: a decision admits only with a valid token.
func TestLeaseSteps(t *testing.T) {
	rc := RuleConfig{Name: "r", Limit: 100, Unit: time.Second, Action: ActionReject}
	m, l := leasedMeter(t, rc, 0)
	sub := int64(time.Second / 6)
	type step struct {
		at      int64
		grant   int64 // tokens granted before deciding (0: none)
		expires int64
		n       int // decisions
		admit   int // of which admitted
		tokens  int64
	}
	steps := []step{
		{at: 0, n: 2, admit: 0},                                     // nothing leased yet
		{at: 10, grant: 3, expires: sub, n: 5, admit: 3},            // three tokens, three admissions
		{at: 20, grant: 2, expires: sub, n: 1, admit: 1, tokens: 1}, // one left
		{at: sub, n: 1, admit: 0, tokens: 1},                        // expired at the boundary: not spendable
	}
	for i, s := range steps {
		if s.grant > 0 {
			l.Grant(s.grant, 0, s.expires)
		}
		got := 0
		for range s.n {
			if m.Admit(s.at, Normal).Verdict == Admit {
				got++
			}
		}
		if got != s.admit || l.Tokens() != s.tokens {
			t.Errorf("step %d at %d: admitted %d tokens %d, want %d and %d", i, s.at, got, l.Tokens(), s.admit, s.tokens)
		}
	}
	if n := l.Drain(); n != 1 {
		t.Errorf("Drain returned %d unspent tokens, want 1", n)
	}
	if st := m.Status(); st.Admitted != 4 || st.Refused != 5 {
		t.Errorf("status admitted %d refused %d, want 4 and 5", st.Admitted, st.Refused)
	}
}

// TestLeaseQueueServedFirst: delayed requests are released by the next
// grant before any new arrival takes a token.
func TestLeaseQueueServedFirst(t *testing.T) {
	rc := RuleConfig{Name: "d", Limit: 100, Unit: time.Second, Action: ActionDelay}
	m, l := leasedMeter(t, rc, 0)
	var waits []*Wait
	for range 3 {
		d := m.Admit(1, Normal)
		if d.Verdict != Delay {
			t.Fatalf("without tokens got %v, want delay", d.Verdict)
		}
		waits = append(waits, d.Wait)
	}
	select {
	case <-l.Need():
	default:
		t.Fatal("a decision without a token did not ask the leaser for more")
	}
	l.Grant(4, 0, int64(time.Second))
	// The next decision releases the three queued requests first and takes
	// the fourth token itself; the one after finds none left.
	if d := m.Admit(2, Normal); d.Verdict != Admit {
		t.Fatalf("arrival after the grant got %v, want admit", d.Verdict)
	}
	if d := m.Admit(2, Normal); d.Verdict != Delay {
		t.Fatalf("arrival with no token left got %v, want delay", d.Verdict)
	}
	for i, w := range waits {
		if !w.Admitted() {
			t.Errorf("wait %d not admitted", i)
		}
	}
	if l.Tokens() != 0 {
		t.Errorf("tokens left %d, want 0", l.Tokens())
	}
}

// TestLeaseModes: local divides the limit by the node count, open applies
// the full limit, closed admits nothing.
func TestLeaseModes(t *testing.T) {
	rc := RuleConfig{Name: "m", Limit: 10, Unit: time.Second, Action: ActionReject}
	for _, tc := range []struct {
		name    string
		mode    int32
		divisor int64
		want    int
	}{
		{"local3", LeaseLocal, 3, 3},
		{"local20", LeaseLocal, 20, 1},
		{"open", LeaseOpen, 3, 10},
		{"closed", LeaseClosed, 3, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, l := leasedMeter(t, rc, time.Second) // a wait budget must not delay closed or local
			l.SetMode(tc.mode, tc.divisor)
			got := 0
			for range 30 {
				if m.Admit(5, Normal).Verdict == Admit {
					got++
				}
			}
			if got != tc.want {
				t.Errorf("admitted %d, want %d", got, tc.want)
			}
		})
	}
}

// TestLeasePerStateLimit: the local word still caps at the state's limit
// even with tokens to spare, and the lease reports the state.
func TestLeasePerStateLimit(t *testing.T) {
	rc := RuleConfig{Name: "s", Limit: 10, LowLimit: 4, Unit: time.Second, Action: ActionReject}
	m, l := leasedMeter(t, rc, 0)
	l.Grant(100, 0, int64(time.Second))
	got := 0
	for range 10 {
		if m.Admit(1, Low).Verdict == Admit {
			got++
		}
	}
	if got != 4 || l.State() != Low || l.Tokens() != 96 {
		t.Errorf("admitted %d state %v tokens %d, want 4 Low 96", got, l.State(), l.Tokens())
	}
}

// TestLeaseWaitBudget: a decision without a token waits for a grant within
// its budget.
func TestLeaseWaitBudget(t *testing.T) {
	rc := RuleConfig{Name: "w", Limit: 100, Unit: time.Second, Action: ActionReject}
	m, l := leasedMeter(t, rc, 5*time.Second)
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-l.Need()
		l.Grant(1, 0, int64(time.Second))
	}()
	if d := m.Admit(1, Normal); d.Verdict != Admit {
		t.Errorf("got %v, want admit after the refill", d.Verdict)
	}
	<-done
	l.SetDryUntil(10)
	start := time.Now()
	if d := m.Admit(2, Normal); d.Verdict != Refuse {
		t.Errorf("with the budget spent got %v, want refuse", d.Verdict)
	}
	if time.Since(start) >= 5*time.Second {
		t.Error("a decision waited for a refill while the budget was known to be spent")
	}
}

// TestLeaseConcurrentExact: goroutines hammering a lease admit exactly the
// tokens granted.
func TestLeaseConcurrentExact(t *testing.T) {
	rc := RuleConfig{Name: "c", Limit: 1 << 30, Unit: time.Hour, Action: ActionReject}
	m, l := leasedMeter(t, rc, 0)
	l.Grant(1000, 0, int64(time.Hour))
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 300 {
				if m.Admit(1, Normal).Verdict == Admit {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if admitted.Load() != 1000 || l.Tokens() != 0 {
		t.Errorf("admitted %d tokens %d, want 1000 and 0", admitted.Load(), l.Tokens())
	}
	if l.Arrivals() != 2400 {
		t.Errorf("arrivals %d, want 2400", l.Arrivals())
	}
}

func TestLeaseAdmitAllocs(t *testing.T) {
	rc := RuleConfig{Name: "a", Limit: 1 << 30, Unit: time.Hour}
	m, l := leasedMeter(t, rc, 0)
	l.Grant(1<<40, 0, int64(time.Hour))
	if n := testing.AllocsPerRun(1000, func() { m.Admit(1, Normal) }); n != 0 {
		t.Errorf("allocs per leased admission = %v, want 0", n)
	}
}

// TestMOPLeaseModes: a MOP with a lease spends tokens when shared, runs its
// GCRA at the allowed rate ÷ divisor when local, and refuses when closed.
func TestMOPLeaseModes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mode    int32
		divisor int64
		grant   int64
		want    int
	}{
		{"shared", LeaseShared, 1, 7, 7},
		{"local", LeaseLocal, 4, 0, 25},
		{"open", LeaseOpen, 4, 0, 100},
		{"closed", LeaseClosed, 1, 50, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewMOP(MOPConfig{Name: "b", InitialRate: 100, MinRate: 1, Burst: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			l := NewLease(0, nil)
			l.SetMode(tc.mode, tc.divisor)
			l.Grant(tc.grant, 0, int64(time.Hour))
			m.SetLease(l)
			got := 0
			for range 200 {
				if m.Allow(1) {
					got++
				}
			}
			if got != tc.want {
				t.Errorf("admitted %d of 200 at one instant, want %d", got, tc.want)
			}
			if a, r := m.LocalCounts(); int(a) < got || int(a+r) < 200 {
				t.Errorf("local counts admitted %d refused %d after %d admitted of 200", a, r, got)
			}
		})
	}
}

// TestMOPFollowerAndSource: a follower does not learn from its samples; a
// count source replaces the node's own counts in the learner and status.
func TestMOPFollowerAndSource(t *testing.T) {
	m, _ := NewMOP(MOPConfig{Name: "b", InitialRate: 100, MinRate: 1})
	m.SetCountSource(func() (uint64, uint64) { return 12345, 6 })
	if st := m.Status(); st.Admitted != 12345 || st.Refused != 6 {
		t.Errorf("status with a count source: %+v", st)
	}
	before := m.Status().AllowedRate
	m.SetFollower(true)
	for i := range 100 {
		m.Observe(int64(i)*int64(time.Second), 99, 100) // far over any ceiling
	}
	if st := m.Status(); st.AllowedRate != before || st.MemoryFraction != 0.99 {
		t.Errorf("follower changed its rate to %v (was %v) or lost the sample: %+v", st.AllowedRate, before, st)
	}
	m.SetFollower(false)
	m.Observe(101*int64(time.Second), 99, 100)
	if st := m.Status(); st.AllowedRate >= before {
		t.Errorf("learner did not cut over the ceiling: %v", st.AllowedRate)
	}
}

// TestLeasePutBackAfterDrain: a token taken before a Drain and not spent
// is dropped, not added to the tokens granted after the Drain.
func TestLeasePutBackAfterDrain(t *testing.T) {
	l := NewLease(0, nil)
	l.Grant(2, 0, 100)
	g1, ok1 := l.take(1)
	g2, ok2 := l.take(1)
	if !ok1 || !ok2 {
		t.Fatal("two tokens granted, could not take them")
	}
	l.putBack(g1) // same generation: back
	if l.Tokens() != 1 {
		t.Fatalf("tokens %d after a put-back, want 1", l.Tokens())
	}
	if n := l.Drain(); n != 1 {
		t.Fatalf("Drain returned %d, want 1", n)
	}
	l.Grant(5, 0, 200)
	l.putBack(g2) // taken before the Drain: dropped
	if l.Tokens() != 5 {
		t.Errorf("tokens %d, want 5: a token of the drained sub-interval came back", l.Tokens())
	}
}

// TestLeaseTokenBounds: tokens are spendable only by decisions made inside
// their sub-interval's bounds; a decision that waited for a refill decides
// at the clock's time after the wait, not at its earlier reading.
func TestLeaseTokenBounds(t *testing.T) {
	rc := RuleConfig{Name: "b", Limit: 100, Unit: time.Second, Action: ActionReject}
	m, err := NewMeter(rc, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	clock := &ManualClock{}
	l := NewLease(5*time.Second, clock)
	m.SetLease(l)
	l.Grant(3, 100, 200)
	l.SetDryUntil(1 << 62) // no waiting for these three
	for _, tc := range []struct {
		now  int64
		want Verdict
	}{{99, Refuse}, {100, Admit}, {199, Admit}, {200, Refuse}} {
		if d := m.Admit(tc.now, Normal); d.Verdict != tc.want {
			t.Errorf("decision at %d: %v, want %v", tc.now, d.Verdict, tc.want)
		}
	}
	l.SetDryUntil(0)
	// Spending the first tokens may have left a request for more in Need;
	// the leaser below must answer the one the waiting decision sends.
	select {
	case <-l.Need():
	default:
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-l.Need()
		clock.Set(300)
		l.Grant(1, 300, 400)
	}()
	if d := m.Admit(250, Normal); d.Verdict != Admit { // read 250, admitted at 300 after the wait
		t.Errorf("decision that waited for the next grant: %v, want admit", d.Verdict)
	}
	<-done
}
