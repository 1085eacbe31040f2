package demo

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// client talks to a backend over loopback without a cookie jar or
// keep-alive, so that no goroutine outlives a test.
var client = &http.Client{
	Transport: &http.Transport{DisableKeepAlives: true},
	Timeout:   10 * time.Second,
}

// fetch GETs url with an optional session cookie and returns the status,
// the body and the session cookie set by the answer ("" if none).
func fetch(t *testing.T, url, session string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if session != "" {
		req.AddCookie(&http.Cookie{Name: SessionCookie, Value: session})
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read body: %v", url, err)
	}
	set := ""
	for _, c := range resp.Cookies() {
		if c.Name == SessionCookie {
			set = c.Value
		}
	}
	return resp.StatusCode, string(body), set
}

func newTestBackend(t *testing.T, cfg HTTPBackendConfig) *HTTPBackend {
	t.Helper()
	b, err := NewHTTPBackend(cfg)
	if err != nil {
		t.Fatalf("NewHTTPBackend: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func TestHTTPBackendSessions(t *testing.T) {
	const sessionBytes = 32 << 10
	l, clk := newTestLedger(t, LedgerConfig{Max: 1 << 20, Base: 1 << 10})
	b := newTestBackend(t, HTTPBackendConfig{Name: "h1", SessionBytes: sessionBytes, SessionLifetime: 30 * time.Second, Ledger: l})

	code, body, s1 := fetch(t, b.URL()+"/", "")
	if code != http.StatusOK || s1 == "" || body != "h1 new session "+s1+"\n" {
		t.Fatalf("first request: %d %q cookie %q, want 200 \"h1 new session <id>\" with a cookie", code, body, s1)
	}
	if got, want := l.Used(), int64(1<<10+sessionBytes); got != want {
		t.Errorf("after one new session: Used() = %d, want %d", got, want)
	}

	// Reusing the cookie holds nothing new.
	for range 3 {
		code, body, set := fetch(t, b.URL()+"/any/path", s1)
		if code != http.StatusOK || body != "h1 session "+s1+"\n" || set != "" {
			t.Errorf("request on session: %d %q set-cookie %q, want 200 \"h1 session %s\" and no cookie", code, body, set, s1)
		}
	}
	if got := l.Live(); got != 1 {
		t.Errorf("after cookie reuse: Live() = %d, want 1", got)
	}

	// A second client without a cookie gets a second session.
	_, _, s2 := fetch(t, b.URL()+"/", "")
	if s2 == "" || s2 == s1 {
		t.Fatalf("second session id %q (first %q)", s2, s1)
	}
	if got, want := l.Used(), int64(1<<10+2*sessionBytes); got != want {
		t.Errorf("after two sessions: Used() = %d, want %d", got, want)
	}

	// Metrics and health are on the same listener and see the sessions.
	code, body, _ = fetch(t, b.MetricsURL(), "")
	if code != http.StatusOK || !strings.Contains(body, "demo_live_sessions 2\n") {
		t.Errorf("GET /metrics: %d, body without demo_live_sessions 2:\n%s", code, body)
	}
	if code, _, _ = fetch(t, b.HealthURL(), ""); code != http.StatusOK {
		t.Errorf("GET /health: %d, want 200", code)
	}

	// Logout releases at once.
	if _, body, _ = fetch(t, b.URL()+"/logout", s2); body != "h1 ended session "+s2+"\n" {
		t.Errorf("logout: %q", body)
	}
	if got := l.Live(); got != 1 {
		t.Errorf("after logout: Live() = %d, want 1", got)
	}

	// After its lifetime the session is gone: its cookie starts a new one.
	clk.Advance(30 * time.Second)
	l.Sweep()
	if got := l.Used(); got != 1<<10 {
		t.Errorf("after expiry: Used() = %d, want the base %d", got, 1<<10)
	}
	_, body, s3 := fetch(t, b.URL()+"/", s1)
	if s3 == "" || s3 == s1 || body != "h1 new session "+s3+"\n" {
		t.Errorf("request with an expired cookie: %q cookie %q, want a new session", body, s3)
	}
}

func TestHTTPBackendOutOfMemory(t *testing.T) {
	l, _ := newTestLedger(t, LedgerConfig{Max: 2 << 10, Limit: 2 << 10})
	b := newTestBackend(t, HTTPBackendConfig{Name: "h2", SessionBytes: 1 << 10, Ledger: l})
	for i := range 2 {
		if code, body, _ := fetch(t, b.URL(), ""); code != http.StatusOK {
			t.Fatalf("session %d: %d %q", i, code, body)
		}
	}
	code, body, set := fetch(t, b.URL(), "")
	if code != http.StatusServiceUnavailable || set != "" || !strings.Contains(body, "h2 out of memory") {
		t.Errorf("third session past the limit: %d %q cookie %q, want 503 out of memory and no cookie", code, body, set)
	}
	if code, _, _ := fetch(t, b.HealthURL(), ""); code != http.StatusTooManyRequests {
		t.Errorf("GET /health at 100%%: %d, want 429", code)
	}
}

// TestHTTPBackendOwnLedger covers the default ledger: real sweeper, freed on
// Shutdown.
func TestHTTPBackendOwnLedger(t *testing.T) {
	b, err := NewHTTPBackend(HTTPBackendConfig{Name: "h3", MaxMemory: 8 << 20, BaseMemory: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, s := fetch(t, b.URL(), ""); s == "" {
		t.Errorf("no session cookie")
	}
	l := b.Ledger()
	if got, want := l.Used(), int64(1<<20+DefaultSessionBytes); got != want {
		t.Errorf("Used() = %d, want %d", got, want)
	}
	if got := l.Max(); got != 8<<20 {
		t.Errorf("Max() = %d, want %d", got, 8<<20)
	}
	if err := b.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if l.Live() != 0 {
		t.Errorf("after Shutdown: Live() = %d, want 0", l.Live())
	}
	if err := b.Close(); err != nil {
		t.Errorf("Close after Shutdown: %v", err)
	}
}

func TestHTTPBackendConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  HTTPBackendConfig
		want string
	}{
		{"negative bytes", HTTPBackendConfig{SessionBytes: -1}, "session bytes"},
		{"negative lifetime", HTTPBackendConfig{SessionLifetime: -time.Second}, "session lifetime"},
		{"negative max", HTTPBackendConfig{MaxMemory: -1}, "max memory"},
		{"negative base", HTTPBackendConfig{BaseMemory: -1}, "base memory"},
		{"bad addr", HTTPBackendConfig{Addr: "127.0.0.1:-5"}, "listen"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := NewHTTPBackend(tc.cfg)
			if err == nil {
				b.Close()
				t.Fatalf("NewHTTPBackend(%+v): nil error", tc.cfg)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}
