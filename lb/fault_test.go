package lb

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// blackHole accepts TCP connections and never answers nor closes them
// until the test ends: a backend whose threads are all hung.
func blackHole(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return ln.Addr().String()
}

// TestFaultBlackHoleProbe: a backend that accepts and never answers
// passes a TCP connect but fails the HTTP probe on its timeout, and the
// health checker takes it down after Fall probes.
func TestFaultBlackHoleProbe(t *testing.T) {
	addr := blackHole(t)
	b, _ := NewBackend(BackendConfig{Addr: addr, Proto: "http"})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if got, err := (TCPProber{}).Probe(ctx, b); got != ProbeUp {
		t.Fatalf("tcp probe of a black hole = %v (%v); the listener is open, want up", got, err)
	}
	pctx, pcancel := context.WithTimeout(ctx, 100*time.Millisecond)
	got, err := (HTTPProber{AnyBelow500: true}).Probe(pctx, b)
	pcancel()
	if got != ProbeDown || err == nil {
		t.Fatalf("http probe of a black hole = %v, %v; want down with an error", got, err)
	}

	h, err := NewHealthChecker(HealthConfig{Interval: time.Second, Timeout: 50 * time.Millisecond, Fall: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.Add(b, HTTPProber{AnyBelow500: true})
	for i := 1; i <= 3; i++ {
		h.ProbeAll(ctx)
		want := Up
		if i == 3 {
			want = Down
		}
		if s := b.State(0); s != want {
			t.Fatalf("after %d timed-out probes state = %v, want %v", i, s, want)
		}
	}
}

// TestFaultHTTPProberDefaultPath: the default probe (GET / with
// AnyBelow500) takes any answer below 500 as proof of life, 429 as busy,
// 5xx as down; a configured health path keeps the strict 2xx/3xx rule.
func TestFaultHTTPProberDefaultPath(t *testing.T) {
	var mu sync.Mutex
	code, path := 200, ""
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		path = r.URL.Path
		c := code
		mu.Unlock()
		w.WriteHeader(c)
	}))
	defer srv.Close()
	b, _ := NewBackend(BackendConfig{Addr: srv.Listener.Addr().String()})
	for _, tc := range []struct {
		code        int
		lax, strict ProbeResult
	}{
		{200, ProbeUp, ProbeUp},
		{301, ProbeUp, ProbeUp},
		{401, ProbeUp, ProbeDown},
		{404, ProbeUp, ProbeDown},
		{429, ProbeBusy, ProbeBusy},
		{500, ProbeDown, ProbeDown},
		{503, ProbeDown, ProbeDown},
	} {
		mu.Lock()
		code = tc.code
		mu.Unlock()
		if got, err := (HTTPProber{AnyBelow500: true}).Probe(context.Background(), b); got != tc.lax {
			t.Errorf("default probe, status %d = %v (%v), want %v", tc.code, got, err, tc.lax)
		}
		mu.Lock()
		p := path
		mu.Unlock()
		if p != "/" {
			t.Errorf("default probe asked for %q, want /", p)
		}
		if got, err := (HTTPProber{Path: "/healthz"}).Probe(context.Background(), b); got != tc.strict {
			t.Errorf("/healthz probe, status %d = %v (%v), want %v", tc.code, got, err, tc.strict)
		}
	}
}

// TestFaultPassiveChargedAtEnd: a timeout is charged when it fires, so the
// ejection lasts its full cool-down from then; after the cool-down one
// more failure ejects again at once (probation) and a success ends the
// probation. OnEject is called once per ejection, not per extension.
func TestFaultPassiveChargedAtEnd(t *testing.T) {
	const s = int64(time.Second)
	type ejection struct {
		r     Result
		until int64
	}
	var ejections []ejection
	bs := newBackends(t, 1, 1)
	p, err := NewPool(PoolConfig{Passive: PassiveConfig{MaxFails: 3, Cooldown: 10 * time.Second, OnEject: func(b *Backend, r Result, until int64) {
		ejections = append(ejections, ejection{r, until})
	}}}, bs)
	if err != nil {
		t.Fatal(err)
	}
	b := p.Backends()[0]
	// Three requests started at 0..2 s time out 30 s later (their ends).
	for i := range int64(3) {
		b.Acquire()
		b.Release(30*s+i*s, Timeout)
	}
	steps := []struct {
		at   int64
		want State
	}{
		{31 * s, Down},
		{41 * s, Down}, // a charge at the request's start (2 s) would have ended at 12 s
		{42 * s, Up},   // cool-down from the third timeout's end: 32 s + 10 s
	}
	for _, st := range steps {
		if got := b.State(st.at); got != st.want {
			t.Fatalf("state at %ds = %v, want %v", st.at/s, got, st.want)
		}
	}
	if len(ejections) != 1 || ejections[0] != (ejection{Timeout, 42 * s}) {
		t.Fatalf("ejections %+v, want one by a timeout until 42s", ejections)
	}
	// A request that started while it was ejected and fails after the
	// cool-down: probation ejects at once.
	b.Acquire()
	b.Release(43*s, ConnectError)
	if got := b.State(43 * s); got != Down {
		t.Fatalf("one failure on probation: state %v, want down", got)
	}
	// A failure landing while ejected extends it without a second event.
	b.Acquire()
	b.Release(50*s, Timeout)
	if got := b.State(59 * s); got != Down {
		t.Fatalf("extended ejection: state at 59s = %v, want down", got)
	}
	if got := b.State(60 * s); got != Up {
		t.Fatalf("extended ejection: state at 60s = %v, want up", got)
	}
	if len(ejections) != 2 || ejections[1] != (ejection{ConnectError, 53 * s}) {
		t.Fatalf("ejections %+v, want a second one by a connect error until 53s", ejections)
	}
	// A success ends probation: it takes MaxFails failures again.
	b.Acquire()
	b.Release(61*s, OK)
	for i := range int64(2) {
		b.Acquire()
		b.Release(62*s+i, ServerError)
	}
	if got := b.State(63 * s); got != Up {
		t.Fatalf("two failures after a success: state %v, want up", got)
	}
	if o := b.Outstanding(); o != 0 {
		t.Errorf("outstanding %d, want 0", o)
	}
}

// TestFaultAvoidRetryAfter: a 503 with Retry-After keeps new work away for
// that long (capped at MaxAvoid) while pinned traffic continues; a shorter
// Retry-After never cuts a longer one short.
func TestFaultAvoidRetryAfter(t *testing.T) {
	const s = int64(time.Second)
	bs := newBackends(t, 1, 1)
	p, err := NewPool(PoolConfig{}, bs)
	if err != nil {
		t.Fatal(err)
	}
	b := p.Backends()[0]
	if !b.Avoid(0, 30*time.Second) {
		t.Error("first Avoid did not report a new avoidance")
	}
	if b.Avoid(1*s, 5*time.Second) || b.Avoid(2*s, 0) { // shorter, none: ignored
		t.Error("a shorter or empty Avoid reported a new avoidance")
	}
	for _, st := range []struct {
		at   int64
		want State
	}{{0, Draining}, {29 * s, Draining}, {30 * s, Up}} {
		if got := b.State(st.at); got != st.want {
			t.Errorf("state at %ds = %v, want %v", st.at/s, got, st.want)
		}
	}
	if p.Pinned(b.ID(), 10*s) != b {
		t.Error("pinned traffic refused while avoided")
	}
	for range 20 {
		if got, out, _ := p.Pick(10*s, 0, nil); got == b || out != Picked {
			t.Fatalf("pick while avoided = %v, %v; want the other backend", got, out)
		}
	}
	b.Avoid(100*s, 24*time.Hour)
	if got := b.State(100*s + int64(MaxAvoid)); got != Up {
		t.Errorf("Retry-After of a day: state after MaxAvoid = %v, want up", got)
	}
	// SetBusy(-1) ("until cleared") is not shortened by a Retry-After.
	b.SetBusy(-1)
	b.Avoid(0, time.Second)
	if got := b.State(1000 * s); got != Draining {
		t.Errorf("busy until cleared, then Avoid: state %v, want draining", got)
	}
}
