package persist

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
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

// TestEventsHandlerNewest: order=newest gives the newest limit events of
// the window (what the dashboard shows: a backend going down a moment ago
// must appear however busy the log is) and how many older ones of the
// window it left out; the window straddles segments.
func TestEventsHandlerNewest(t *testing.T) {
	c := newClock(t0)
	s := openTest(t, Config{Dir: t.TempDir(), SweepInterval: -1, Now: c.now})
	pad := strings.Repeat("x", 3000) // about 340 events a segment
	var evs []admission.Event
	for i := range 1100 {
		evs = append(evs, ev(t0.Add(time.Duration(i-1100)*time.Second), fmt.Sprintf("e%04d %s", i, pad)))
	}
	for i := 0; i < len(evs); i += 100 { // within the queue's size
		appendAll(t, s, evs[i:i+100]...)
	}
	if n := len(s.segs); n < 3 {
		t.Fatalf("%d segments, want the window to straddle several", n)
	}
	h := s.EventsHandler()
	since := t0.Add(-1000 * time.Second).Format(time.RFC3339) // e0100 on: 1000 events
	page := func(target string) EventsPage {
		t.Helper()
		rec := get(t, h, "GET", target)
		var p EventsPage
		if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &p) != nil {
			t.Fatalf("GET %s = %d %.200q", target, rec.Code, rec.Body)
		}
		return p
	}
	first := func(p EventsPage) string { return p.Events[0].Message[:5] }
	last := func(p EventsPage) string { return p.Events[len(p.Events)-1].Message[:5] }

	p := page("/events?since=" + since + "&limit=300&order=newest")
	if len(p.Events) != 300 || first(p) != "e0800" || last(p) != "e1099" || p.Omitted != 700 || !p.More {
		t.Errorf("order=newest: %d events %s..%s omitted %d more %v; want 300, e0800..e1099, omitted 700, more",
			len(p.Events), first(p), last(p), p.Omitted, p.More)
	}
	p = page("/events?since=" + since + "&limit=1000&order=newest")
	if len(p.Events) != 1000 || first(p) != "e0100" || p.Omitted != 0 || p.More {
		t.Errorf("order=newest, all of the window: %d events from %s omitted %d more %v", len(p.Events), first(p), p.Omitted, p.More)
	}
	p = page("/events?since=" + since + "&limit=300")
	if first(p) != "e0100" || last(p) != "e0399" || p.Omitted != 0 || !p.More {
		t.Errorf("default order: %s..%s omitted %d more %v; want the oldest, e0100..e0399, more", first(p), last(p), p.Omitted, p.More)
	}
	if rec := get(t, h, "GET", "/events?since=15m&order=random"); rec.Code != 400 || !strings.Contains(rec.Body.String(), "order") {
		t.Errorf("order=random: %d %q, want 400 naming order", rec.Code, rec.Body)
	}
}
