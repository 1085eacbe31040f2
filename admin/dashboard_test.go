package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicelb/sluice/lb"
)

// syncBuffer is a log destination safe for the handlers' goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testPools builds an HTTP pool (a, shared) and a SIP pool (shared, s):
// "shared" names a backend of each protocol.
func testPools(t *testing.T) (httpPool, sipPool *lb.Pool) {
	t.Helper()
	mk := func(proto string, ids ...string) *lb.Pool {
		var bs []*lb.Backend
		for i, id := range ids {
			b, err := lb.NewBackend(lb.BackendConfig{ID: id, Addr: "127.0.0.1:" + string(rune('1'+i)) + "0000", Proto: proto})
			if err != nil {
				t.Fatal(err)
			}
			bs = append(bs, b)
		}
		p, err := lb.NewPool(lb.PoolConfig{Policy: "weighted-round-robin"}, bs)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	return mk("http", "a", "shared"), mk("sip", "shared", "s")
}

func poolSource(pools ...*lb.Pool) Source {
	return Source{Backends: func() []BackendStatus {
		var out []BackendStatus
		for _, p := range pools {
			for _, b := range p.Backends() {
				out = append(out, FromBackend(b.Status(0), b.MOP()))
			}
		}
		return out
	}}
}

func TestControlEndpoints(t *testing.T) {
	hp, sp := testPools(t)
	var logs syncBuffer
	srv := New(nil)
	d := NewDashboard(DashboardConfig{Source: poolSource(hp, sp), Control: PoolControl(func() []*lb.Pool { return []*lb.Pool{hp, nil, sp} })},
		slog.New(slog.NewTextHandler(&logs, nil)))
	d.Register(srv)
	a, httpShared, sipShared := hp.Lookup("a"), hp.Lookup("shared"), sp.Lookup("shared")
	for _, tc := range []struct {
		name, method, path, body string
		header                   map[string]string
		code                     int
		check                    func() bool
	}{
		{"drain", "POST", "/control/backends/a/drain", "", nil, 200, func() bool { return a.State(0) == lb.Draining }},
		{"drain again is idempotent", "POST", "/control/backends/a/drain", "", nil, 200, func() bool { return a.State(0) == lb.Draining }},
		{"undrain", "POST", "/control/backends/a/undrain", "", nil, 200, func() bool { return a.State(0) == lb.Up }},
		{"weight", "POST", "/control/backends/a/weight", "weight=7", nil, 200, func() bool { return a.Weight() == 7 }},
		{"weight in the query", "POST", "/control/backends/a/weight?weight=9", "", nil, 200, func() bool { return a.Weight() == 9 }},
		{"weight not a number", "POST", "/control/backends/a/weight", "weight=heavy", nil, 400, func() bool { return a.Weight() == 9 }},
		{"weight zero", "POST", "/control/backends/a/weight", "weight=0", nil, 400, func() bool { return a.Weight() == 9 }},
		{"weight too large", "POST", "/control/backends/a/weight", "weight=1001", nil, 400, func() bool { return a.Weight() == 9 }},
		{"unknown backend", "POST", "/control/backends/nope/drain", "", nil, 404, nil},
		{"unknown in protocol", "POST", "/control/backends/a/drain?protocol=sip", "", nil, 404, func() bool { return a.State(0) == lb.Up }},
		{"ambiguous id", "POST", "/control/backends/shared/drain", "", nil, 409,
			func() bool { return httpShared.State(0) == lb.Up && sipShared.State(0) == lb.Up }},
		{"id with protocol", "POST", "/control/backends/shared/drain?protocol=sip", "", nil, 200,
			func() bool { return httpShared.State(0) == lb.Up && sipShared.State(0) == lb.Draining }},
		{"GET drain", "GET", "/control/backends/a/drain", "", nil, 405, func() bool { return a.State(0) == lb.Up }},
		{"GET undrain", "GET", "/control/backends/a/undrain", "", nil, 405, nil},
		{"GET weight", "GET", "/control/backends/a/weight", "", nil, 405, nil},
		{"cross-site post", "POST", "/control/backends/a/drain", "", map[string]string{"Sec-Fetch-Site": "cross-site"}, 403,
			func() bool { return a.State(0) == lb.Up }},
		{"same-origin post", "POST", "/control/backends/a/drain", "", map[string]string{"Sec-Fetch-Site": "same-origin"}, 200,
			func() bool { return a.State(0) == lb.Draining }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body))
			if tc.body != "" {
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			}
			for k, v := range tc.header {
				req.Header.Set(k, v)
			}
			rec := httptest.NewRecorder()
			srv.Handler().ServeHTTP(rec, onLoopback(req))
			if rec.Code != tc.code {
				t.Fatalf("%s %s = %d %q, want %d", tc.method, tc.path, rec.Code, rec.Body.String(), tc.code)
			}
			if tc.check != nil && !tc.check() {
				t.Errorf("%s %s: backend not in the expected state", tc.method, tc.path)
			}
		})
	}
	// Every change is logged with who made it; so is a refused one.
	out := logs.String()
	for _, re := range []string{
		`msg="backend changed by operator".*action=drain backend=a .*remote=192\.0\.2\.1:1234`,
		`msg="backend changed by operator".*action=weight backend=a .*result="weight 1 -> 7"`,
		`msg="backend control refused".*backend=shared .*remote=192\.0\.2\.1:1234.*more than one protocol`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("log lacks %s:\n%s", re, out)
		}
	}
}

func TestControlUnavailable(t *testing.T) {
	srv := New(nil)
	NewDashboard(DashboardConfig{}, nil).Register(srv)
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, onLoopback(httptest.NewRequest("POST", "/control/backends/a/drain", nil)))
	if rec.Code != http.StatusNotImplemented {
		t.Errorf("drain without Control = %d, want 501", rec.Code)
	}
}

// TestDashboardPageAndAssets: / is the page, and every script and style
// sheet it names is embedded and served (a vendor refresh that renamed the
// directory without updating the page would fail here); nothing is loaded
// from another host.
func TestDashboardPageAndAssets(t *testing.T) {
	srv := New(nil)
	NewDashboard(DashboardConfig{}, nil).Register(srv)
	get := func(path string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, onLoopback(httptest.NewRequest("GET", path, nil)))
		return rec
	}
	page := get("/")
	if page.Code != 200 || !strings.HasPrefix(page.Header().Get("Content-Type"), "text/html") {
		t.Fatalf("GET / = %d %s", page.Code, page.Header().Get("Content-Type"))
	}
	refs := regexp.MustCompile(`(?:src|href)="([^"]+)"`).FindAllStringSubmatch(page.Body.String(), -1)
	assets := 0
	for _, m := range refs {
		u, err := url.Parse(m[1])
		if err != nil {
			t.Errorf("bad reference %q", m[1])
			continue
		}
		if u.Host != "" || u.Scheme != "" {
			t.Errorf("page loads %s from another host", m[1])
			continue
		}
		if !strings.HasPrefix(u.Path, "/ui/") {
			continue // links to /status, /events
		}
		assets++
		rec := get(u.Path)
		if rec.Code != 200 || rec.Body.Len() < 100 {
			t.Errorf("GET %s = %d, %d bytes", u.Path, rec.Code, rec.Body.Len())
		}
	}
	if assets < 4 {
		t.Errorf("page names %d assets under /ui/, want uPlot's script and css and the dashboard's", assets)
	}
	// The vendored library keeps its licence next to it.
	lic := regexp.MustCompile(`/ui/vendor/uplot-[^/]+/`).FindString(page.Body.String())
	if rec := get(lic + "LICENSE"); rec.Code != 200 || !strings.Contains(rec.Body.String(), "MIT") {
		t.Errorf("GET %sLICENSE = %d, want the MIT licence", lic, rec.Code)
	}
	if rec := get("/nothing-here"); rec.Code != 404 {
		t.Errorf("GET /nothing-here = %d, want 404 (the page is only at /)", rec.Code)
	}
}

// TestSamplerTicks: the sampler records one sample per tick of the
// injected ticker, from the Source, and GET /status/history serves them;
// it starts with Serve and stops at Shutdown.
func TestSamplerTicks(t *testing.T) {
	hp, _ := testPools(t)
	ticks := make(chan time.Time) // unbuffered: a send returns once Run took the tick
	stopped := make(chan struct{})
	src := poolSource(hp)
	calls := 0
	list := src.Backends
	src.Backends = func() []BackendStatus {
		if calls++; calls == 2 { // between the first and second sample
			hp.Lookup("a").Drain(true)
		}
		return list()
	}
	d := NewDashboard(DashboardConfig{Source: src, MOPMaxHeap: 0.85,
		Ticker: func(time.Duration) (<-chan time.Time, func()) { return ticks, func() { close(stopped) } }}, nil)
	srv := New(nil)
	d.Register(srv)
	ln, err := newLocalListener()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	for i := range 3 {
		ticks <- t0.Add(time.Duration(i) * time.Second)
	}
	ctx, cancel := contextWithTimeout(5 * time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	select {
	case <-stopped:
	default:
		t.Fatal("ticker not stopped by Shutdown")
	}
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, onLoopback(httptest.NewRequest("GET", "/status/history", nil)))
	var doc historyDoc
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
		t.Fatalf("history: %v", err)
	}
	if len(doc.T) != 3 || len(doc.Backends) != 2 || doc.MaxHeapPercent != 85 {
		t.Fatalf("history has %d samples, %d backends, ceiling %v; want 3, 2, 85", len(doc.T), len(doc.Backends), doc.MaxHeapPercent)
	}
	if got := show(doc.Backends[0].State); got != "[0 1 1]" {
		t.Errorf("state of a = %s, want [0 1 1] (drained before the second tick)", got)
	}
	rec = httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, onLoopback(httptest.NewRequest("GET", "/status/history?since=yesterday", nil)))
	if rec.Code != 400 || !strings.Contains(rec.Body.String(), "unix milliseconds") {
		t.Errorf("bad since: %d %q", rec.Code, rec.Body.String())
	}
}

// TestServerTasksNeverStartAfterShutdown: a server shut down before it
// served never starts its tasks, so nothing is left running.
func TestServerTasksNeverStartAfterShutdown(t *testing.T) {
	srv := New(nil)
	started := make(chan struct{}, 1)
	srv.Go(func(ctx context.Context) { started <- struct{}{}; <-ctx.Done() })
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	ln, err := newLocalListener()
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := srv.Serve(ln); err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
		t.Error("task started after Shutdown")
	default:
	}
}
