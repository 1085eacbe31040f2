package admin_test

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluicelb/sluice/admin"
	"github.com/sluicelb/sluice/lb"
)

// TestDashboardGroupsByPool drives headless Chromium against a dashboard
// whose /status has two HTTP pools: the table lists the backends in pool
// order, the first row of each pool naming it with its policy, and the
// backend plots sit in one group per pool.
func TestDashboardGroupsByPool(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end browser test skipped in -short mode")
	}
	chromium := needChromium(t)
	var bs []*lb.Backend
	for _, id := range []string{"api1", "web1", "api2", "web2"} {
		b, _ := lb.NewBackend(lb.BackendConfig{ID: id, Addr: "127.0.0.1:1", Proto: "http"})
		bs = append(bs, b)
	}
	src := admin.Source{
		Backends: func() []admin.BackendStatus {
			var out []admin.BackendStatus
			for _, b := range bs {
				out = append(out, admin.FromBackend(b.Status(0), nil))
			}
			return out
		},
		Pools: func() []admin.PoolStatus {
			return []admin.PoolStatus{
				{Protocol: "http", Name: "default", Policy: "round-robin", Backends: []string{"web1", "web2"}},
				{Protocol: "http", Name: "api", Policy: "least-outstanding", Panic: true, Backends: []string{"api1", "api2"}},
			}
		},
	}
	srv := admin.New(nil)
	srv.Handle("GET /status", admin.StatusHandler(src))
	admin.NewDashboard(admin.DashboardConfig{Source: src, Interval: 100 * time.Millisecond}, nil).Register(srv)
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

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.WindowSize(1280, 1000), chromedp.Flag("disable-dev-shm-usage", true))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	browser, cancelBrowser := chromedp.NewContext(allocCtx)
	defer cancelBrowser()
	if err := chromedp.Do(browser, chromedp.Navigate("http://"+ln.Addr().String()+"/")); err != nil {
		t.Fatalf("open dashboard: %v", err)
	}
	ctx, cancel := context.WithTimeout(browser, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Poll[chromedp.Void](`document.querySelectorAll('#backends tbody tr').length === 4 && document.querySelectorAll('#backend-plots .plot').length === 4`,
			chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second))(ctx, tg)
		return err
	})); err != nil {
		state, _ := chromedp.Run(browser, chromedp.Evaluate[string](`document.querySelector('#error').textContent + ' rows=' + document.querySelectorAll('#backends tbody tr').length + ' plots=' + document.querySelectorAll('#backend-plots .plot').length + ' samples=' + document.body.dataset.samples`))
		t.Fatalf("wait for four rows and four plots: %v (%s)", err, state)
	}
	type rowInfo struct {
		Key  string `json:"key"`
		Pool string `json:"pool"`
		Cell string `json:"cell"`
	}
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[[]rowInfo](`[...document.querySelectorAll('#backends tbody tr')].map(tr =>
		({key: tr.dataset.key, pool: tr.dataset.pool, cell: tr.querySelector('.c-pool').textContent}))`))
	if err != nil {
		t.Fatal(err)
	}
	want := []rowInfo{
		{"http/web1", "http/default", "default (round-robin)"}, {"http/web2", "http/default", ""},
		{"http/api1", "http/api", "api (least-outstanding, panic)"}, {"http/api2", "http/api", ""},
	}
	if !slices.Equal(rows, want) {
		t.Errorf("rows %+v\nwant %+v", rows, want)
	}
	groups, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#backend-plots .pool-plots')].map(g =>
		g.dataset.pool + ':' + [...g.querySelectorAll('.plot')].map(p => p.dataset.plot).join(','))`))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"http/default:backend:http/web1,backend:http/web2", "http/api:backend:http/api1,backend:http/api2"}; !slices.Equal(groups, want) {
		t.Errorf("plot groups %q, want %q", groups, want)
	}
}
