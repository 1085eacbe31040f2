package lb

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
)

func TestHealthRiseFall(t *testing.T) {
	b, _ := NewBackend(BackendConfig{Addr: "a:1", Proto: "http"})
	var verdict atomic.Uint32
	var events []string
	sink := func(ev admission.Event) {
		if ev.Kind != admission.EventBackendState || ev.Subject != "http a:1" {
			t.Errorf("event %+v", ev)
		}
		events = append(events, ev.Message)
	}
	h, err := NewHealthChecker(HealthConfig{Interval: time.Second, Rise: 2, Fall: 3, Events: sink}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.Add(b, ProberFunc(func(context.Context, *Backend) (ProbeResult, error) {
		r := ProbeResult(verdict.Load())
		if r == ProbeDown {
			return r, errors.New("refused")
		}
		return r, nil
	}))
	ctx := context.Background()
	steps := []struct {
		probe ProbeResult
		want  State
	}{
		{ProbeUp, Up},
		{ProbeDown, Up},
		{ProbeDown, Up},
		{ProbeDown, Down}, // fall = 3
		{ProbeUp, Down},
		{ProbeDown, Down}, // resets the rise count
		{ProbeUp, Down},
		{ProbeUp, Up}, // rise = 2
		{ProbeBusy, Draining},
		{ProbeUp, Up},
		{ProbeDown, Up},
		{ProbeBusy, Draining}, // busy is alive: resets the fall count
		{ProbeDown, Draining},
		{ProbeDown, Draining},
		{ProbeDown, Down},
	}
	for i, s := range steps {
		verdict.Store(uint32(s.probe))
		h.ProbeAll(ctx)
		if got := b.State(0); got != s.want {
			t.Fatalf("step %d (%v): state = %v, want %v", i, s.probe, got, s.want)
		}
	}
	// down, up, draining, not draining, draining, down
	want := []string{" down ", " up ", " draining", " takes new work", " draining", " down "}
	if len(events) != len(want) {
		t.Fatalf("events %q, want %d", events, len(want))
	}
	for i, w := range want {
		if !strings.Contains(events[i], w) {
			t.Errorf("event %d %q, want it to say %q", i, events[i], w)
		}
	}
}

func TestHTTPProber(t *testing.T) {
	var code atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			w.WriteHeader(404)
			return
		}
		w.WriteHeader(int(code.Load()))
	}))
	defer srv.Close()
	b, _ := NewBackend(BackendConfig{Addr: srv.Listener.Addr().String()})
	p := HTTPProber{Path: "/health"}
	for _, tc := range []struct {
		code int32
		want ProbeResult
	}{{200, ProbeUp}, {204, ProbeUp}, {302, ProbeUp}, {429, ProbeBusy}, {503, ProbeDown}, {500, ProbeDown}} {
		code.Store(tc.code)
		got, err := p.Probe(context.Background(), b)
		if got != tc.want {
			t.Errorf("status %d: probe = %v (%v), want %v", tc.code, got, err, tc.want)
		}
	}
	// A closed port is down.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead, _ := NewBackend(BackendConfig{Addr: ln.Addr().String()})
	ln.Close()
	if got, err := p.Probe(context.Background(), dead); got != ProbeDown || err == nil {
		t.Errorf("closed port: probe = %v, %v; want down with an error", got, err)
	}
	if got, _ := (TCPProber{}).Probe(context.Background(), dead); got != ProbeDown {
		t.Errorf("tcp probe of closed port = %v, want down", got)
	}
	if got, _ := (TCPProber{}).Probe(context.Background(), b); got != ProbeUp {
		t.Errorf("tcp probe of open port = %v, want up", got)
	}
}

func TestHealthCheckerRunStops(t *testing.T) {
	b, _ := NewBackend(BackendConfig{Addr: "a:1"})
	h, err := NewHealthChecker(HealthConfig{Interval: 5 * time.Millisecond, Fall: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.Add(b, ProberFunc(func(context.Context, *Backend) (ProbeResult, error) {
		return ProbeDown, nil
	}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.Run(ctx); close(done) }()
	// A failed probe with fall 1 takes the backend down. (Waiting for the
	// state, not for the probe call: a result that arrives after cancel
	// is dropped by design.)
	deadline := time.Now().Add(10 * time.Second)
	for b.State(0) != Down {
		if time.Now().After(deadline) {
			t.Fatalf("state = %v 10 s after failing probes with fall 1, want down", b.State(0))
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context was cancelled")
	}
}

func TestHealthConfigValidate(t *testing.T) {
	for _, c := range []HealthConfig{
		{Interval: -1},
		{Interval: time.Second, Timeout: 2 * time.Second},
		{Rise: -1},
		{Fall: -2},
	} {
		if _, err := NewHealthChecker(c, nil); err == nil {
			t.Errorf("NewHealthChecker(%+v) succeeded, want an error", c)
		}
	}
}

// TestPoolHealthChecker: every backend of the pool is probed with the
// prober the front end gives for it.
func TestPoolHealthChecker(t *testing.T) {
	var backends []*Backend
	for _, id := range []string{"up", "down"} {
		b, err := NewBackend(BackendConfig{ID: id, Addr: id + ":1", Proto: "sip"})
		if err != nil {
			t.Fatal(err)
		}
		backends = append(backends, b)
	}
	pool, err := NewPool(PoolConfig{Policy: "round-robin"}, backends)
	if err != nil {
		t.Fatal(err)
	}
	var asked []string
	prober := func(b *Backend) Prober {
		asked = append(asked, b.ID())
		return ProberFunc(func(context.Context, *Backend) (ProbeResult, error) {
			if b.ID() == "down" {
				return ProbeDown, errors.New("no answer")
			}
			return ProbeUp, nil
		})
	}
	h, err := NewPoolHealthChecker(HealthConfig{Interval: time.Second, Rise: 1, Fall: 1}, pool, prober, nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(asked, " ") != "up down" {
		t.Fatalf("probers asked for %v, want up and down", asked)
	}
	h.ProbeAll(context.Background())
	for _, b := range backends {
		want := Up
		if b.ID() == "down" {
			want = Down
		}
		if got := b.Status(0).State; got != want {
			t.Errorf("%s: state %v, want %v", b.ID(), got, want)
		}
	}
}
