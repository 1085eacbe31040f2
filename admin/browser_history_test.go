package admin_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluicelb/sluice/admin"
)

// rowStore is an admin.HistoryStore that keeps the rows it is given, as
// the node's store does across a restart.
type rowStore struct {
	mu   sync.Mutex
	rows map[string][][]byte
}

func (s *rowStore) SaveHistory(res string, _ time.Time, row []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rows[res] = append(s.rows[res], row)
}

// pixelsOlderJS counts the pixels of a plot's canvas within 12 of an RGB
// colour left of where the plot puts time cut (unix seconds): a series
// drawn there shows samples older than cut. -1 when the plot is missing.
const pixelsOlderJS = `((key, rgb, cut) => {
  const box = document.querySelector('.plot[data-plot="' + key + '"]');
  if (!box || !box._u) return -1;
  const c = box.querySelector('canvas');
  const w = Math.min(c.width, Math.floor(box._u.valToPos(cut, 'x', true)) - 2);
  if (w <= 0) return 0;
  const d = c.getContext('2d').getImageData(0, 0, w, c.height).data;
  let n = 0;
  for (let i = 0; i < d.length; i += 4)
    if (d[i+3] > 200 && Math.abs(d[i]-rgb[0]) < 12 && Math.abs(d[i+1]-rgb[1]) < 12 && Math.abs(d[i+2]-rgb[2]) < 12) n++;
  return n;
})`

// TestDashboardSpansInBrowser drives headless Chromium against a dashboard
// restarted with the history of the node before it: an hour of samples
// (the last 5 minutes of it after a 1-minute stop). The 24 h view (#span=24h,
// the 10 s ring) draws what was learned more than 15 minutes ago and
// breaks its lines at the restart; the 15 min view (the 1 s ring, which
// holds 16 minutes across the stop) draws nothing older than 15 minutes,
// and moves its window and breaks its lines again with a live sample 5 s
// late; the buttons switch between the views and keep the choice in the
// URL hash.
func TestDashboardSpansInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end browser test skipped in -short mode")
	}
	chromium := needChromium(t)

	// One backend admitting 20 new sessions a second (a counter the
	// sampler turns into a rate), MOP allowing 30/s, having learned 25/s.
	var admitted atomic.Uint64
	src := admin.Source{Backends: func() []admin.BackendStatus {
		n := admitted.Add(20)
		return []admin.BackendStatus{{ID: "h1", Protocol: "http", Addr: "127.0.0.1:1", State: "up", Weight: 1, Requests: n,
			MOP: admin.MOPStatus{Enabled: true, Phase: "learned", AllowedRate: 30, LearnedRate: 25, MemoryPercent: 40, MemoryKnown: true, Admitted: n}}}
	}}
	// The node before the restart: samples a second apart, from an hour
	// ago to 5 minutes ago (the clock is the test's), every one stored.
	now := time.Now().Truncate(time.Second)
	store := &rowStore{rows: map[string][][]byte{}}
	before := admin.NewDashboard(admin.DashboardConfig{Source: src, Store: store}, nil)
	for at := now.Add(-time.Hour); at.Before(now.Add(-5 * time.Minute)); at = at.Add(time.Second) {
		before.Sample(at)
	}
	// The node after it: its rings restored first, then the 4 minutes
	// since the restart; its sampler ticks only when the test says.
	ticks := make(chan time.Time)
	ticker := func(time.Duration) (<-chan time.Time, func()) { return ticks, func() {} }
	after := admin.NewDashboard(admin.DashboardConfig{Source: src, Ticker: ticker}, nil)
	for _, res := range []string{admin.HistoryFine, admin.HistoryCoarse} {
		if n := after.RestoreHistory(res, store.rows[res]); n != len(store.rows[res]) {
			t.Fatalf("restored %d of %d %s rows", n, len(store.rows[res]), res)
		}
	}
	for at := now.Add(-4 * time.Minute); !at.After(now); at = at.Add(time.Second) {
		after.Sample(at)
	}

	srv := admin.New(nil)
	srv.Handle("GET /status", admin.StatusHandler(src))
	after.Register(srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.AllowHosts(ln.Addr().String(), nil); err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}()
	base := "http://" + ln.Addr().String()

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.WindowSize(1280, 1000), chromedp.Flag("disable-dev-shm-usage", true))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	browser, cancelBrowser := chromedp.NewContext(allocCtx)
	defer cancelBrowser()
	if err := chromedp.Do(browser, chromedp.Navigate(base+"/#span=24h")); err != nil {
		t.Fatalf("open dashboard: %v", err)
	}
	ctx, cancel := context.WithTimeout(browser, 60*time.Second)
	defer cancel()

	type view struct {
		Span     string  `json:"span"`
		Interval string  `json:"interval"`
		Hash     string  `json:"hash"`
		Pressed  string  `json:"pressed"`
		Samples  int     `json:"samples"`
		XMin     float64 `json:"xmin"`
		XMax     float64 `json:"xmax"`
		Gaps     int     `json:"gaps"`
		Plots    int     `json:"plots"`
		Error    string  `json:"error"`
	}
	const viewJS = `(() => {
  const u = document.querySelector('.plot[data-plot="backend:http/h1"]')._u;
  // Breaks in the node's used memory (a value in every sample taken):
  // runs of nulls with values on both sides.
  const nr = document.querySelector('.plot[data-plot="memory"]')._u.data[1];
  let gaps = 0;
  for (let i = 1, seen = false; i < nr.length; i++) {
    if (nr[i] !== null) seen = true;
    else if (seen && nr[i-1] !== null && nr.slice(i).some(x => x !== null)) gaps++;
  }
  return {span: document.body.dataset.span, interval: document.body.dataset.interval, hash: location.hash,
    pressed: [...document.querySelectorAll('.span-choice button[aria-pressed="true"]')].map(b => b.dataset.span).join(','),
    samples: Number(document.body.dataset.samples), xmin: u.scales.x.min, xmax: u.scales.x.max, gaps,
    plots: document.querySelectorAll('#backend-plots .plot').length, error: document.querySelector('#error').textContent};
})()`
	// waitSpan waits for the page to show span with its ring's interval.
	waitSpan := func(span, interval string) view {
		t.Helper()
		cond := fmt.Sprintf(`document.body.dataset.span === %q && document.body.dataset.interval === %q && !!document.querySelector('.plot[data-plot="backend:http/h1"]')`, span, interval)
		if err := chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Poll[chromedp.Void](cond, chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second))(ctx, tg)
			return err
		})); err != nil {
			state, _ := chromedp.Run(browser, chromedp.Evaluate[string](`document.querySelector('#error').textContent + ' span=' + document.body.dataset.span + ' interval=' + document.body.dataset.interval`))
			t.Fatalf("wait for the %s view: %v (%s)", span, err, state)
		}
		v, err := chromedp.Run(ctx, chromedp.Evaluate[view](viewJS))
		if err != nil {
			t.Fatalf("read the %s view: %v", span, err)
		}
		return v
	}
	green := [3]int{0x2e, 0x7d, 0x32} // admitted new /s
	cut := float64(now.Add(-15 * time.Minute).Unix())
	older := func() int {
		t.Helper()
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](fmt.Sprintf("%s(%q, [%d,%d,%d], %g)", pixelsOlderJS, "backend:http/h1", green[0], green[1], green[2], cut)))
		if err != nil {
			t.Fatalf("read pixels: %v", err)
		}
		return n
	}
	click := func(span string) {
		t.Helper()
		if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(fmt.Sprintf(`.span-choice button[data-span=%q]`, span)))); err != nil {
			t.Fatalf("click %s: %v", span, err)
		}
	}
	hour := float64(now.Add(-time.Hour).Unix())
	end := float64(now.Unix())

	// Opened with #span=24h: the 10 s ring, from an hour ago (learned
	// before the restart) to now, broken once (the stop).
	v := waitSpan("24h", "10")
	t.Logf("24 h view: %+v", v)
	coarse := len(store.rows[admin.HistoryCoarse])
	if v.Pressed != "24h" || v.Plots != 1 || v.Error != "" {
		t.Errorf("24 h view: pressed %q, %d backend plots, error %q; want 24h, 1, none", v.Pressed, v.Plots, v.Error)
	}
	if v.XMin > hour+10 || v.XMax != end || v.Samples < coarse+20 || v.Gaps != 1 {
		t.Errorf("24 h view: x from %.0f s to %.0f s before now, %d samples, %d breaks; want from 3600 (%d stored before the restart, 25 since), to 0, 1 break",
			end-v.XMin, end-v.XMax, v.Samples, v.Gaps, coarse)
	}
	if n := older(); n < 20 {
		t.Errorf("24 h view: %d pixels of admitted new work older than 15 minutes, want a drawn line (>= 20)", n)
	}

	// The 15 min button: the 1 s ring's last 15 minutes only, though it
	// holds 16 across the stop.
	click("15m")
	v = waitSpan("15m", "1")
	t.Logf("15 min view: %+v", v)
	if v.Hash != "#span=15m" || v.Pressed != "15m" || v.Plots != 1 || v.Error != "" {
		t.Errorf("15 min view: hash %q, pressed %q, %d backend plots, error %q; want #span=15m, 15m, 1, none", v.Hash, v.Pressed, v.Plots, v.Error)
	}
	if v.XMin <= cut || v.XMax != end || v.Samples != 900-60 || v.Gaps != 1 {
		t.Errorf("15 min view: x from %.0f s to %.0f s before now, %d samples, %d breaks; want from under 900 to 0, 840 (15 minutes but the minute stopped), 1 break",
			end-v.XMin, end-v.XMax, v.Samples, v.Gaps)
	}
	if n := older(); n != 0 {
		t.Errorf("15 min view: %d pixels of admitted new work older than 15 minutes, want none", n)
	}

	// A live sample 5 s after the last (a short stop): the page takes it
	// on its next refresh, breaks its lines again and moves its window.
	ticks <- now.Add(5 * time.Second)
	if err := chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Poll[chromedp.Void](`Number(document.body.dataset.samples) !== 840`,
			chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second))(ctx, tg)
		return err
	})); err != nil {
		t.Fatalf("wait for the live sample: %v", err)
	}
	if v, err = chromedp.Run(ctx, chromedp.Evaluate[view](viewJS)); err != nil {
		t.Fatal(err)
	}
	t.Logf("15 min view, a sample later: %+v", v)
	if v.XMin <= cut+5 || v.XMax != end+5 || v.Samples != 840-5+1 || v.Gaps != 2 {
		t.Errorf("15 min view a sample later: x from %.0f s to %.0f s before now, %d samples, %d breaks; want from under 895 to -5, 836, 2 breaks",
			end-v.XMin, end-v.XMax, v.Samples, v.Gaps)
	}

	// And back: the 24 h view again, kept in the hash.
	click("24h")
	if v = waitSpan("24h", "10"); v.Hash != "#span=24h" || v.XMin > hour+10 {
		t.Errorf("24 h view again: hash %q, x from %.0f s before now; want #span=24h, 3600", v.Hash, end-v.XMin)
	}
}
