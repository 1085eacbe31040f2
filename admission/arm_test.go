package admission

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type wantRow struct {
	admitted, released, refused int
	rate, queued                int64
}

func checkRows(t *testing.T, rc RuleConfig, arrivals []int, want []wantRow) {
	t.Helper()
	rows, err := Simulate(rc, arrivals)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(want) {
		t.Errorf("got %d intervals, want %d", len(rows), len(want))
	}
	for i, w := range want {
		if i >= len(rows) {
			t.Errorf("interval %d: missing, want %+v", i+1, w)
			continue
		}
		r := rows[i]
		got := wantRow{r.Admitted, r.Released, r.Refused, r.Rate, r.Queued}
		if got != w {
			t.Errorf("interval %d (arrived %d): got admitted=%d released=%d refused=%d rate=%d queued=%d, want %d %d %d %d %d",
				i+1, r.Arrived, got.admitted, got.released, got.refused, got.rate, got.queued,
				w.admitted, w.released, w.refused, w.rate, w.queued)
		}
	}
}

// TestARMSeedVector reproduces the TDWM seed's table (SPEC §3): limit
// 10/min, qualification 0, arrivals 1,2,2,3,2,1,3,0,0,0.
func TestARMSeedVector(t *testing.T) {
	rc := RuleConfig{Name: "seed", Limit: 10, Unit: time.Minute}
	checkRows(t, rc, []int{1, 2, 2, 3, 2, 1, 3, 0, 0, 0}, []wantRow{
		{1, 0, 0, 1, 0},
		{2, 0, 0, 3, 0},
		{2, 0, 0, 5, 0},
		{3, 0, 0, 8, 0},
		{2, 0, 0, 10, 0},
		{0, 0, 0, 10, 1}, // the 11th request is delayed
		{0, 1, 0, 10, 3}, // interval 1 expires (10→9), the 11th is released (→10), 3 queue
		{0, 2, 0, 10, 1}, // two expire (→8), two released (→10)
		{0, 1, 0, 9, 0},  // two expire (→8), one released (→9), queue empty
		{0, 0, 0, 6, 0},  // three expire (→6)
	})
}

func TestARMVectors(t *testing.T) {
	cases := []struct {
		name     string
		rc       RuleConfig
		arrivals []int
		want     []wantRow
	}{
		{
			// 6/s: sub-intervals of 166.67ms; 3 arrive at once in each.
			name:     "per second",
			rc:       RuleConfig{Name: "s", Limit: 6, Unit: time.Second},
			arrivals: []int{3, 3, 3, 0, 0, 0, 0, 0},
			want: []wantRow{
				{3, 0, 0, 3, 0},
				{3, 0, 0, 6, 0},
				{0, 0, 0, 6, 3},
				{0, 0, 0, 6, 3},
				{0, 0, 0, 6, 3},
				{0, 0, 0, 6, 3},
				{0, 3, 0, 6, 0}, // interval 1 expires: its 3 slots go to the queue
				{0, 0, 0, 3, 0}, // interval 2 expires (→3)
			},
		},
		{
			name:     "per hour",
			rc:       RuleConfig{Name: "h", Limit: 4, Unit: time.Hour},
			arrivals: []int{2, 2, 2, 0, 0, 0, 0, 0},
			want: []wantRow{
				{2, 0, 0, 2, 0},
				{2, 0, 0, 4, 0},
				{0, 0, 0, 4, 2},
				{0, 0, 0, 4, 2},
				{0, 0, 0, 4, 2},
				{0, 0, 0, 4, 2},
				{0, 2, 0, 4, 0},
				{0, 0, 0, 2, 0},
			},
		},
		{
			name:     "bounded queue refuses",
			rc:       RuleConfig{Name: "q", Limit: 3, Unit: time.Minute, Queue: 2},
			arrivals: []int{5, 1, 0, 0, 0, 0, 0},
			want: []wantRow{
				{3, 0, 0, 3, 2},
				{0, 0, 1, 3, 2}, // queue full: refused
				{0, 0, 0, 3, 2},
				{0, 0, 0, 3, 2},
				{0, 0, 0, 3, 2},
				{0, 0, 0, 3, 2},
				{0, 2, 0, 2, 0}, // 3 expire (→0), 2 released (→2)
			},
		},
		{
			name:     "reject action",
			rc:       RuleConfig{Name: "r", Limit: 10, Unit: time.Minute, Action: ActionReject},
			arrivals: []int{1, 2, 2, 3, 2, 1, 3, 0, 0, 0},
			want: []wantRow{
				{1, 0, 0, 1, 0},
				{2, 0, 0, 3, 0},
				{2, 0, 0, 5, 0},
				{3, 0, 0, 8, 0},
				{2, 0, 0, 10, 0},
				{0, 0, 1, 10, 0},
				{1, 0, 2, 10, 0}, // one slot freed by expiry, 2 refused
				{0, 0, 0, 8, 0},
				{0, 0, 0, 6, 0},
				{0, 0, 0, 3, 0},
			},
		},
		{
			// The rate reaches the limit at t=12.5s (2nd arrival of interval
			// 2) and may exceed it for 25s, until t=37.5s.
			name:     "qualification time",
			rc:       RuleConfig{Name: "qual", Limit: 4, Unit: time.Minute, Qualify: 25 * time.Second},
			arrivals: []int{2, 3, 2, 2, 2, 1, 0, 0, 0, 0},
			want: []wantRow{
				{2, 0, 0, 2, 0},
				{3, 0, 0, 5, 0}, // reaches 4 at the 3rd arrival; the 5th is over, qualifying
				{2, 0, 0, 7, 0},
				{2, 0, 0, 9, 0},
				{0, 0, 0, 9, 2}, // t=40s: qualified 27.5s, now throttling
				{0, 0, 0, 9, 3},
				{0, 0, 0, 7, 3}, // interval 1 expires (→7): still over the limit
				{0, 0, 0, 4, 3}, // interval 2 expires (→4)
				{0, 2, 0, 4, 1}, // 2 expire (→2), 2 released (→4)
				{0, 1, 0, 3, 0}, // 2 expire (→2), 1 released (→3)
			},
		},
		{
			name:     "log action admits over the limit",
			rc:       RuleConfig{Name: "l", Limit: 2, Unit: time.Minute, Action: ActionLog},
			arrivals: []int{3, 1},
			want:     []wantRow{{3, 0, 0, 3, 0}, {1, 0, 0, 4, 0}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { checkRows(t, tc.rc, tc.arrivals, tc.want) })
	}
}

func TestARMMaxWaitRefuses(t *testing.T) {
	m, err := NewMeter(RuleConfig{Name: "w", Limit: 1, Unit: time.Minute, MaxWait: 15 * time.Second}, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := m.Admit(0, Normal); d.Verdict != Admit {
		t.Fatalf("first: got %v", d.Verdict)
	}
	d := m.Admit(int64(time.Second), Normal)
	if d.Verdict != Delay || d.Wait == nil {
		t.Fatalf("second: got %v, want delay", d.Verdict)
	}
	m.Advance(int64(15 * time.Second)) // 1+15 s not yet reached
	select {
	case <-d.Wait.Done():
		t.Fatal("wait ended before its deadline")
	default:
	}
	m.Advance(int64(16 * time.Second))
	<-d.Wait.Done()
	if d.Wait.Admitted() {
		t.Fatal("timed-out wait reports admitted")
	}
	// The oldest counted sub-interval (0–10 s) expires at 60 s.
	if got, want := d.Wait.RetryAfter(), 44*time.Second; got != want {
		t.Errorf("retry after: got %v, want %v", got, want)
	}
	if st := m.Status(); st.Queued != 0 || st.Refused != 1 {
		t.Errorf("status after timeout: %+v", st)
	}
}

func TestARMRetryAfter(t *testing.T) {
	m, _ := NewMeter(RuleConfig{Name: "r", Limit: 2, Unit: time.Minute, Action: ActionReject}, 0, nil)
	m.Admit(int64(5*time.Second), Normal)  // sub-interval 0 (0–10 s)
	m.Admit(int64(25*time.Second), Normal) // sub-interval 2
	d := m.Admit(int64(30*time.Second), Normal)
	if d.Verdict != Refuse {
		t.Fatalf("got %v, want refuse", d.Verdict)
	}
	if want := 30 * time.Second; d.RetryAfter != want { // sub-interval 0 expires at 60 s
		t.Errorf("retry after: got %v, want %v", d.RetryAfter, want)
	}
	if got := RetryAfterSeconds(300 * time.Millisecond); got != 1 {
		t.Errorf("RetryAfterSeconds(300ms) = %d, want 1", got)
	}
	if got := RetryAfterSeconds(1500 * time.Millisecond); got != 2 {
		t.Errorf("RetryAfterSeconds(1.5s) = %d, want 2", got)
	}
}

func TestARMNoOvertaking(t *testing.T) {
	m, _ := NewMeter(RuleConfig{Name: "o", Limit: 1, Unit: time.Minute}, 0, nil)
	m.Admit(0, Normal)
	first := m.Admit(1, Normal)
	second := m.Admit(2, Normal)
	if first.Verdict != Delay || second.Verdict != Delay {
		t.Fatalf("got %v, %v; want both delayed", first.Verdict, second.Verdict)
	}
	m.Advance(int64(time.Minute)) // one slot frees
	if !first.Wait.Admitted() || second.Wait.Admitted() {
		t.Fatalf("release order: first=%v second=%v", first.Wait.Admitted(), second.Wait.Admitted())
	}
	// A new arrival while someone waits is queued behind, even with room.
	third := m.Admit(int64(time.Minute)+1, Normal)
	if third.Verdict != Delay {
		t.Fatalf("new arrival overtook the queue: %v", third.Verdict)
	}
}

func TestARMCancel(t *testing.T) {
	m, _ := NewMeter(RuleConfig{Name: "c", Limit: 1, Unit: time.Minute}, 0, nil)
	m.Admit(0, Normal)
	a := m.Admit(1, Normal)
	b := m.Admit(2, Normal)
	if !a.Wait.Cancel() {
		t.Fatal("cancel of a waiting request failed")
	}
	if a.Wait.Cancel() {
		t.Fatal("second cancel succeeded")
	}
	m.Advance(int64(time.Minute))
	if !b.Wait.Admitted() {
		t.Fatal("request behind a canceled one was not released")
	}
	if st := m.Status(); st.Queued != 0 || st.Rate != 1 {
		t.Errorf("status: %+v", st)
	}
}

func TestARMStateLimits(t *testing.T) {
	var events []Event
	var mu sync.Mutex
	sink := func(e Event) { mu.Lock(); events = append(events, e); mu.Unlock() }
	rc := RuleConfig{Name: "s", Limit: 10, Unit: time.Second, LowLimit: 4, LowUnit: time.Minute, LowerLimit: 2, Action: ActionReject}
	m, err := NewMeter(rc, 0, sink)
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 1 || events[0].Kind != EventConfigWarning || !strings.Contains(events[0].Message, "ignored") {
		t.Fatalf("want one config warning about the ignored unit, got %+v", events)
	}
	admitted := func(state MemState, now int64, n int) (k int) {
		for i := 0; i < n; i++ {
			if m.Admit(now, state).Verdict == Admit {
				k++
			}
		}
		return
	}
	if got := admitted(Low, 0, 10); got != 4 {
		t.Errorf("low: admitted %d, want 4 (per second, the base unit)", got)
	}
	if got := admitted(Lower, int64(2*time.Second), 10); got != 2 {
		t.Errorf("lower: admitted %d, want 2", got)
	}
	if got := admitted(Normal, int64(4*time.Second), 20); got != 10 {
		t.Errorf("normal: admitted %d, want 10", got)
	}
}

func TestARMEvents(t *testing.T) {
	var kinds []EventKind
	m, _ := NewMeter(RuleConfig{Name: "e", Limit: 1, Unit: time.Minute, Action: ActionReject}, 0,
		func(e Event) { kinds = append(kinds, e.Kind) })
	m.Admit(0, Normal)
	m.Admit(1, Normal)
	m.Admit(2, Normal)
	m.Advance(int64(time.Minute)) // under the limit from here
	if fmt.Sprint(kinds) != fmt.Sprint([]EventKind{EventARMEngaged, EventARMRefusing}) {
		t.Errorf("events before a whole unit under the limit: %v", kinds)
	}
	m.Advance(2 * int64(time.Minute))
	// Two refusals, one refusing event; released after a unit under the limit.
	want := []EventKind{EventARMEngaged, EventARMRefusing, EventARMReleased}
	if fmt.Sprint(kinds) != fmt.Sprint(want) {
		t.Errorf("events: got %v, want %v", kinds, want)
	}
}

// TestARMEventsSteadyOverload: a rule held at its limit for ten windows
// dips under it at every sub-interval boundary; it writes one engaged and
// one refusing event, not an event per dip.
func TestARMEventsSteadyOverload(t *testing.T) {
	var kinds []EventKind
	m, _ := NewMeter(RuleConfig{Name: "s", Limit: 60, Unit: time.Second, Action: ActionReject}, 0,
		func(e Event) { kinds = append(kinds, e.Kind) })
	step := int64(time.Second) / 120 // 120 offers a second against a limit of 60
	for now := int64(0); now < 10*int64(time.Second); now += step {
		m.Advance(now)
		m.Admit(now, Normal)
	}
	if want := []EventKind{EventARMEngaged, EventARMRefusing}; fmt.Sprint(kinds) != fmt.Sprint(want) {
		t.Errorf("events over ten windows at the limit: got %d %v, want %v", len(kinds), kinds, want)
	}
}

// TestARMConcurrentExact hammers one rule from 8 goroutines and checks the
// exact admitted count in every window of six consecutive sub-intervals.
// The goroutines move through the sub-intervals together (a barrier per
// sub-interval), so every count belongs to a known sub-interval while all 8
// race inside it.
func TestARMConcurrentExact(t *testing.T) {
	const limit, goroutines, perPhase, phases = 50, 8, 40, 36
	m, err := NewMeter(RuleConfig{Name: "c", Limit: limit, Unit: time.Second, Action: ActionReject}, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	sub := int64(time.Second) / 6
	var counts [phases]atomic.Int64
	for p := 0; p < phases; p++ {
		var wg sync.WaitGroup
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < perPhase; i++ {
					if m.Admit(int64(p)*sub+int64(i), Normal).Verdict == Admit {
						counts[p].Add(1)
					}
				}
			}()
		}
		wg.Wait()
	}
	// Demand (320 per sub-interval) always exceeds the limit, so every
	// window of six holds exactly the limit.
	for i := 0; i+6 <= phases; i++ {
		var sum int64
		for j := i; j < i+6; j++ {
			sum += counts[j].Load()
		}
		if sum != limit {
			t.Fatalf("sub-intervals %d..%d admitted %d, want exactly %d", i, i+5, sum, limit)
		}
	}
}

// TestARMBatchedReservations: with a large limit the fast path reserves in
// batches per shard; no window may admit more than the limit, and
// reservations left unused are given back when the sub-interval rotates.
func TestARMBatchedReservations(t *testing.T) {
	const limit, goroutines, phases = 6000, 8, 24
	m, _ := NewMeter(RuleConfig{Name: "b", Limit: limit, Unit: time.Second, Action: ActionReject}, 0, nil)
	sub := int64(time.Second) / 6
	var counts [phases]atomic.Int64
	for p := 0; p < phases; p++ {
		perG := 100 // 800 per sub-interval: under the limit for six
		if p%6 == 5 {
			perG = 2000 // 16,000: far over
		}
		var wg sync.WaitGroup
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < perG; i++ {
					if m.Admit(int64(p)*sub+int64(i), Normal).Verdict == Admit {
						counts[p].Add(1)
					}
				}
			}()
		}
		wg.Wait()
	}
	for p := 0; p < 5; p++ {
		if got := counts[p].Load(); got != goroutines*100 {
			t.Errorf("sub-interval %d under the limit: admitted %d, want all %d", p, got, goroutines*100)
		}
	}
	for i := 0; i+6 <= phases; i++ {
		var sum int64
		for j := i; j < i+6; j++ {
			sum += counts[j].Load()
		}
		if sum > limit {
			t.Fatalf("sub-intervals %d..%d admitted %d > limit %d", i, i+5, sum, limit)
		}
		if i%6 == 0 && sum < limit*95/100 {
			t.Errorf("sub-intervals %d..%d admitted %d: reservations were lost (limit %d, demand far over)", i, i+5, sum, limit)
		}
	}
	st := m.Status()
	var total int64
	for i := range counts {
		total += counts[i].Load()
	}
	if int64(st.Admitted) < total-int64(numShards*maxBatch) || int64(st.Admitted) > total+int64(numShards*maxBatch) {
		t.Errorf("status admitted %d, counted %d", st.Admitted, total)
	}
}

func TestARMFastPathAllocs(t *testing.T) {
	m, _ := NewMeter(RuleConfig{Name: "a", Limit: 1 << 30, Unit: time.Hour}, 0, nil)
	now := int64(0)
	if n := testing.AllocsPerRun(1000, func() { now++; m.Admit(now, Normal) }); n != 0 {
		t.Errorf("Admit allocates %v per call, want 0", n)
	}
}

func TestParseRule(t *testing.T) {
	cases := []struct {
		in      string
		want    RuleConfig
		wantErr string
	}{
		{in: "name=a,limit=10/min", want: RuleConfig{Name: "a", Limit: 10, Unit: time.Minute}},
		{
			in: "name=api,proto=http,method=post,host=example.com,path=/api/,limit=100/s,action=reject,queue=500,wait=2s,qualify=10s,low=50/s,lower=10/hour",
			want: RuleConfig{Name: "api", Match: Match{Proto: "http", Method: "POST", Host: "example.com", PathPrefix: "/api/"},
				Limit: 100, Unit: time.Second, Action: ActionReject, Queue: 500, MaxWait: 2 * time.Second, Qualify: 10 * time.Second,
				LowLimit: 50, LowerLimit: 10, LowerUnit: time.Hour},
		},
		{in: "limit=10/min", wantErr: "name is required"},
		{in: "name=a", wantErr: "limit is required"},
		{in: "name=a,limit=10/day", wantErr: "unit must be"},
		{in: "name=a,limit=x/s", wantErr: "whole number"},
		{in: "name=a,limit=10/s,action=drop", wantErr: "unknown action"},
		{in: "name=a,limit=10/s,bogus=1", wantErr: "unknown key"},
		{in: "name=a,limit=10/s,proto=ftp", wantErr: "proto must be"},
		{in: "name=a,limit=10/s,queue=0", wantErr: "queue must be"},
		{in: "name=a,limit", wantErr: "not key=value"},
		{in: "name=ldn,pool=london,limit=300/s", want: RuleConfig{Name: "ldn", Match: Match{Pool: "london"}, Limit: 300, Unit: time.Second}},
		{
			in:   "name=x,proto=sip,method=invite,pool=voice_eu-2,limit=1/s",
			want: RuleConfig{Name: "x", Match: Match{Proto: "sip", Method: "INVITE", Pool: "voice_eu-2"}, Limit: 1, Unit: time.Second},
		},
		{in: "name=a,pool= london ,limit=1/s", want: RuleConfig{Name: "a", Match: Match{Pool: "london"}, Limit: 1, Unit: time.Second}},
		// An empty value matches any pool, as the other match keys do.
		{in: "name=a,pool=,limit=1/s", want: RuleConfig{Name: "a", Limit: 1, Unit: time.Second}},
		{in: "name=a,pool=London,limit=1/s", wantErr: `-arm "name=a,pool=London,limit=1/s": pool: "London": want a pool name: 1 to 64 characters out of a-z, 0-9, _ and - (lower case)`},
		{in: "name=a,pool=lon don,limit=1/s", wantErr: `pool: "lon don": want a pool name`},
		{in: "name=a,pool=api.v2,limit=1/s", wantErr: `pool: "api.v2": want a pool name`},
		{in: "name=a,pool=caf\u00e9,limit=1/s", wantErr: "pool: \"caf\u00e9\": want a pool name"},
		{in: "name=a,pool=" + strings.Repeat("p", 65) + ",limit=1/s", wantErr: `want a pool name: 1 to 64 characters`},
		{in: "name=a,pool=" + strings.Repeat("p", 64) + ",limit=1/s", want: RuleConfig{Name: "a", Match: Match{Pool: strings.Repeat("p", 64)}, Limit: 1, Unit: time.Second}},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseRule(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got err %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func FuzzParseRule(f *testing.F) {
	f.Add("name=a,limit=10/min")
	f.Add("name=api,proto=sip,method=INVITE,limit=100/s,action=delay,queue=5,wait=2s,qualify=1s,low=5/s,lower=1/s")
	f.Add("name=ldn,proto=http,host=a.example,path=/v1/,pool=london,limit=3/min,lower=1/h")
	f.Fuzz(func(t *testing.T, s string) {
		rc, err := ParseRule(s)
		if err == nil {
			if err := rc.Validate(); err != nil {
				t.Fatalf("ParseRule accepted %q but Validate rejects: %v", s, err)
			}
			if _, err := NewMeter(rc, 0, nil); err != nil {
				t.Fatalf("ParseRule accepted %q but NewMeter rejects: %v", s, err)
			}
			// What FormatRule writes (the control API, /control/config,
			// the data directory) reads back as the same rule.
			back, err := ParseRule(FormatRule(rc))
			if rc.Queue == 1000 {
				rc.Queue = 0 // the default is left out, and 0 means it
			}
			if err != nil || back != rc {
				t.Fatalf("ParseRule(%q) = %+v; FormatRule gives %q, read back as %+v, %v", s, rc, FormatRule(rc), back, err)
			}
		}
	})
}

// TestMatchPool: a rule with a pool matches only requests routed to that
// pool, exactly (no case folding, no prefix), alongside the other keys;
// a rule without one matches every pool and requests of a front end
// without pools.
func TestMatchPool(t *testing.T) {
	api := Request{Proto: "http", Method: "POST", Host: "api.example.com", Path: "/v1/x", Pool: "api"}
	static := Request{Proto: "http", Method: "GET", Host: "www.example.com", Path: "/static/a.css", Pool: "static"}
	noPools := Request{Proto: "http", Method: "POST", Host: "api.example.com", Path: "/v1/x"}
	london := Request{Proto: "sip", Method: "INVITE", Host: "voice.example", Pool: "london"}
	for _, tc := range []struct {
		name string
		m    Match
		r    Request
		want bool
	}{
		{"no pool key, pooled request", Match{}, api, true},
		{"no pool key, no pools", Match{}, noPools, true},
		{"same pool", Match{Pool: "api"}, api, true},
		{"other pool", Match{Pool: "api"}, static, false},
		{"pool key, request without pool", Match{Pool: "api"}, noPools, false},
		{"exact, not a prefix", Match{Pool: "ap"}, api, false},
		{"exact, not a longer name", Match{Pool: "api2"}, api, false},
		{"case-sensitive", Match{Pool: "API"}, api, false},
		{"pool and proto", Match{Proto: "http", Pool: "api"}, api, true},
		{"pool and other proto", Match{Proto: "sip", Pool: "api"}, api, false},
		{"pool and method", Match{Method: "post", Pool: "api"}, api, true},
		{"pool and other method", Match{Method: "GET", Pool: "api"}, api, false},
		{"pool and host", Match{Host: "API.example.com", Pool: "api"}, api, true},
		{"pool and other host", Match{Host: "www.example.com", Pool: "api"}, api, false},
		{"pool and path", Match{PathPrefix: "/v1/", Pool: "api"}, api, true},
		{"pool and other path", Match{PathPrefix: "/static/", Pool: "api"}, api, false},
		{"path matches, pool does not", Match{PathPrefix: "/static/", Pool: "api"}, static, false},
		{"every key", Match{Proto: "sip", Method: "INVITE", Host: "voice.example", Pool: "london"}, london, true},
		{"every key but the pool", Match{Proto: "sip", Method: "INVITE", Host: "voice.example", Pool: "paris"}, london, false},
	} {
		if got := tc.m.Matches(&tc.r); got != tc.want {
			t.Errorf("%s: %+v matches %+v: %v, want %v", tc.name, tc.m, tc.r, got, tc.want)
		}
	}
}

func TestCheckPoolName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"default", true}, {"london", true}, {"a", true}, {"eu-west_2", true}, {"0", true}, {"-", true},
		{strings.Repeat("z", MaxPoolName), true},
		{"", false}, {strings.Repeat("z", MaxPoolName+1), false}, {"London", false}, {"a b", false},
		{"a.b", false}, {"a,b", false}, {"a=b", false}, {"a/b", false}, {"caf\u00e9", false}, {"a\x00", false}, {"\"a\"", false},
	} {
		err := CheckPoolName(tc.name)
		if (err == nil) != tc.ok {
			t.Errorf("CheckPoolName(%q) = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
	if err := (RuleConfig{Name: "r", Match: Match{Pool: "Bad"}, Limit: 1, Unit: time.Second}).Validate(); err == nil ||
		!strings.Contains(err.Error(), `arm rule r: pool "Bad": want a pool name`) {
		t.Errorf("Validate of a bad pool: %v", err)
	}
	if _, err := NewController(ControllerConfig{Rules: []RuleConfig{{Name: "r", Match: Match{Pool: "a b"}, Limit: 1, Unit: time.Second}}}, nil, 0); err == nil ||
		!strings.Contains(err.Error(), `ControllerConfig.Rules: arm rule r: pool "a b"`) {
		t.Errorf("NewController with a bad pool: %v", err)
	}
}

// TestMatchGETCoversHEAD: an HTTP rule for GET matches HEAD too (servers
// run the GET handler for it); with method=GET, HEAD escaped the rule.
// Other methods, and SIP, compare as written.
func TestMatchGETCoversHEAD(t *testing.T) {
	for _, tc := range []struct {
		rule, proto, method string
		want                bool
	}{
		{"GET", "http", "GET", true},
		{"GET", "http", "HEAD", true},
		{"get", "http", "head", true},
		{"GET", "http", "POST", false},
		{"HEAD", "http", "GET", false},
		{"POST", "http", "HEAD", false},
		{"GET", "sip", "HEAD", false},
		{"", "http", "HEAD", true},
	} {
		m := Match{Method: tc.rule}
		if got := m.Matches(&Request{Proto: tc.proto, Method: tc.method}); got != tc.want {
			t.Errorf("rule method=%s matches %s %s: %v, want %v", tc.rule, tc.proto, tc.method, got, tc.want)
		}
	}
}
