package persist

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func get(t *testing.T, h http.Handler, method, target string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, target, nil))
	return rec
}

func TestEventsHandlerBadParams(t *testing.T) {
	s := openTest(t, Config{Dir: t.TempDir(), SweepInterval: -1})
	h := s.EventsHandler()
	tests := []struct {
		target string
		code   int
		want   string // in the body
	}{
		{"/events?since=yesterday", 400, "since"},
		{"/events?since=2026-11-29", 400, "RFC 3339"},
		{"/events?since=-5m", 400, "since"},
		{"/events?limit=abc", 400, "limit"},
		{"/events?limit=0", 400, "limit"},
		{"/events?limit=-1", 400, "limit"},
		{"/events?limit=10001", 400, "10000"},
		{"/events?since=2026-11-29T15:00:00Z&limit=x", 400, "limit"},
	}
	for _, tc := range tests {
		t.Run(tc.target, func(t *testing.T) {
			rec := get(t, h, "GET", tc.target)
			if rec.Code != tc.code || !strings.Contains(rec.Body.String(), tc.want) {
				t.Errorf("GET %s = %d %q; want %d containing %q", tc.target, rec.Code, rec.Body, tc.code, tc.want)
			}
		})
	}
	if rec := get(t, h, "POST", "/events"); rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") == "" {
		t.Errorf("POST /events = %d, Allow %q; want 405 with Allow", rec.Code, rec.Header().Get("Allow"))
	}
}

func TestEventsHandler(t *testing.T) {
	c := newClock(t0)
	s := openTest(t, Config{Dir: t.TempDir(), SweepInterval: -1, Now: c.now})
	h := s.EventsHandler()
	sec := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Second) }
	page := func(target string) EventsPage {
		t.Helper()
		rec := get(t, h, "GET", target)
		if rec.Code != 200 || rec.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("GET %s = %d %s %q", target, rec.Code, rec.Header().Get("Content-Type"), rec.Body)
		}
		var p EventsPage
		if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
			t.Fatalf("GET %s: %v in %q", target, err, rec.Body)
		}
		return p
	}

	if p := page("/events"); p.Events == nil || len(p.Events) != 0 || p.More {
		t.Errorf("empty log: %+v; want an empty list", p)
	}
	appendAll(t, s, ev(sec(-120), "a"), ev(sec(-60), "b"), ev(sec(-30), "c"), ev(sec(0), "d"))

	tests := []struct {
		target string
		want   string
		more   bool
	}{
		{"/events", "[a b c d]", false},
		{"/events?limit=2", "[c d]", true}, // without since: the newest
		{"/events?since=" + sec(-60).Format(time.RFC3339), "[b c d]", false},
		{"/events?since=2026-11-29T14:59:00Z&limit=2", "[b c]", true},
		{"/events?since=2026-11-29T14:59:00.5Z&limit=2", "[c d]", false},
		{"/events?since=2026-11-29T15:59:00%2B01:00", "[b c d]", false}, // same instant, +01:00
		{"/events?since=45s", "[c d]", false},                           // a duration: that long before now
		{"/events?since=2026-11-29T16:00:00Z", "[]", false},
	}
	for _, tc := range tests {
		p := page(tc.target)
		if got := messages(p.Events); fmt.Sprint(got) != tc.want || p.More != tc.more {
			t.Errorf("GET %s = %q more=%v; want %s more=%v", tc.target, got, p.More, tc.want, tc.more)
		}
	}
}

func TestParseSince(t *testing.T) {
	now := t0
	for _, tc := range []struct {
		in   string
		want time.Time
		ok   bool
	}{
		{"", time.Time{}, true},
		{"2026-11-29T15:00:00Z", t0, true},
		{"2026-11-29T15:00:00.25Z", t0.Add(250 * time.Millisecond), true},
		{"2026-11-29T16:00:00+01:00", t0, true},
		{"1h30m", t0.Add(-90 * time.Minute), true},
		{"0s", time.Time{}, false},
		{"-1h", time.Time{}, false},
		{"2026-11-29 15:00:00", time.Time{}, false},
		{"1732892400", time.Time{}, false},
	} {
		got, err := ParseSince(tc.in, now)
		if (err == nil) != tc.ok || tc.ok && !got.Equal(tc.want) {
			t.Errorf("ParseSince(%q) = %v, %v; want %v ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}
