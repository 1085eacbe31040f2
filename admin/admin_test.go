package admin

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

type fakeMem struct{ used int64 }

func (f *fakeMem) ReadMemory() (int64, int64) { return f.used, 1000 }

func TestHealthz(t *testing.T) {
	reader := &fakeMem{}
	mem, err := admission.NewMemory(admission.MemoryConfig{Limit: 1000}, reader, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := Healthz(mem)
	for _, tc := range []struct {
		used  int64
		code  int
		state string
	}{{100, 200, "normal"}, {750, 429, "low"}, {850, 429, "lower"}, {950, 429, "critical"}, {100, 200, "normal"}} {
		reader.used = tc.used
		mem.Sample()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
		if rec.Code != tc.code || strings.TrimSpace(rec.Body.String()) != tc.state {
			t.Errorf("used %d: %d %q, want %d %q", tc.used, rec.Code, rec.Body.String(), tc.code, tc.state)
		}
	}
	rec := httptest.NewRecorder()
	Healthz(nil).ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	if rec.Code != 200 {
		t.Errorf("nil memory: %d, want 200", rec.Code)
	}
}

func TestStatusJSON(t *testing.T) {
	mop, _ := admission.NewMOP(admission.MOPConfig{Name: "b1", InitialRate: 10})
	mop.Observe(0, 400, 1000)
	b1, _ := lb.NewBackend(lb.BackendConfig{ID: "b1", Addr: "127.0.0.1:18081", Proto: "http", MOP: mop})
	b2, _ := lb.NewBackend(lb.BackendConfig{Addr: "127.0.0.1:18082", Proto: "http"})
	pool, err := lb.NewPool(lb.PoolConfig{}, []*lb.Backend{b1, b2})
	if err != nil {
		t.Fatal(err)
	}
	b2.Drain(true)
	b1.Acquire()
	rc, _ := admission.ParseRule("name=api,limit=100/s")
	ctrl, err := admission.NewController(admission.ControllerConfig{Rules: []admission.RuleConfig{rc}}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	src := Source{Controller: ctrl, Backends: func() []BackendStatus {
		var out []BackendStatus
		for _, b := range pool.Backends() {
			out = append(out, FromBackend(b.Status(0), b.MOP()))
		}
		return out
	}}
	srv := New(nil)
	srv.Handle("GET /status", StatusHandler(src))
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, onLoopback(httptest.NewRequest("GET", "/status", nil)))
	if rec.Code != 200 {
		t.Fatalf("status %d", rec.Code)
	}
	// Decode generically: the field names are the contract.
	var doc map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc["memory_state"] != "normal" {
		t.Errorf("memory_state = %v", doc["memory_state"])
	}
	bs := doc["backends"].([]any)
	if len(bs) != 2 {
		t.Fatalf("backends = %v", bs)
	}
	first := bs[0].(map[string]any)
	for k, want := range map[string]any{"id": "b1", "protocol": "http", "addr": "127.0.0.1:18081", "state": "up", "outstanding": 1.0} {
		if first[k] != want {
			t.Errorf("backend[0].%s = %v, want %v", k, first[k], want)
		}
	}
	m := first["mop"].(map[string]any)
	for k, want := range map[string]any{"phase": "discovery", "allowed_rate": 10.0, "learned_rate": 0.0, "memory_percent": 40.0} {
		if m[k] != want {
			t.Errorf("mop.%s = %v, want %v", k, m[k], want)
		}
	}
	if s := bs[1].(map[string]any)["state"]; s != "draining" {
		t.Errorf("backend[1].state = %v, want draining", s)
	}
	arm := doc["arm"].([]any)[0].(map[string]any)
	for k, want := range map[string]any{"name": "api", "rate": 0.0, "limit": 100.0, "queued": 0.0} {
		if arm[k] != want {
			t.Errorf("arm.%s = %v, want %v", k, arm[k], want)
		}
	}
}

func TestServeAndShutdown(t *testing.T) {
	srv := New(nil)
	srv.Handle("GET /healthz", Healthz(nil))
	ln, err := newLocalListener()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	resp, err := http.Get("http://" + ln.Addr().String() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("healthz = %d", resp.StatusCode)
	}
	ctx, cancel := contextWithTimeout(5 * time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("Serve after Shutdown = %v, want nil", err)
	}
}

// TestStatusFailedProbe: a backend whose memory probe fails shows no
// memory (null, not 0 like an idle backend), the reason and the count.
func TestStatusFailedProbe(t *testing.T) {
	mop, _ := admission.NewMOP(admission.MOPConfig{Name: "b1", InitialRate: 10})
	decode := func() map[string]any {
		t.Helper()
		b, err := json.Marshal(FromMOP(mop))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	if m := decode(); m["memory_percent"] != nil {
		t.Errorf("before any sample memory_percent = %v, want null", m["memory_percent"])
	}
	mop.Observe(0, 400, 1000)
	if m := decode(); m["memory_percent"] != 40.0 || m["probe_error"] != nil {
		t.Errorf("after a sample: %v, want memory_percent 40 and no probe_error", m)
	}
	mop.ProbeFailed(errors.New("poll memory b1: status 302: redirects are not followed"))
	m := decode()
	if v, ok := m["memory_percent"]; !ok || v != nil {
		t.Errorf("after a failed probe memory_percent = %v (present %v), want null", v, ok)
	}
	if m["probe_error"] != "poll memory b1: status 302: redirects are not followed" || m["probe_failures"] != 1.0 {
		t.Errorf("after a failed probe: %v, want the error and 1 failure", m)
	}
}
