package admin_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluicelb/sluice/admin"
	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/internal/testenv"
	"github.com/sluicelb/sluice/lb"
	"github.com/sluicelb/sluice/persist"
)

// needChromium returns the browser the end-to-end tests drive; without one
// the test skips, or fails in CI (internal/testenv).
func needChromium(t *testing.T) string {
	t.Helper()
	c := findChromium()
	if c == "" {
		testenv.Missing(t, "chromium not found (Debian package chromium; scripts/install-test-deps.sh installs it)")
	}
	return c
}

// findChromium returns the browser the end-to-end test drives, or "".
func findChromium() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// startDemo builds sluice, starts `sluice demo` on free loopback ports and
// returns its HTTP and admin addresses. The process is stopped (SIGINT,
// then SIGKILL) when the test ends.
func startDemo(t *testing.T) (httpAddr, adminAddr string) {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go tool not found: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "sluice")
	if out, err := exec.Command(goTool, "build", "-o", bin, "github.com/sluicelb/sluice/cmd/sluice").CombinedOutput(); err != nil {
		t.Fatalf("build sluice: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "demo", "-http-listen", "127.0.0.1:0", "-sip-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0",
		"-data-dir", t.TempDir(), "-drain-timeout", "1s", "-mop-probe-interval", "250ms")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start sluice demo: %v", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Errorf("sluice demo did not stop on SIGINT within 15s")
		}
		if t.Failed() {
			t.Logf("sluice demo stderr:\n%s", stderr.String())
		}
	})
	httpRe := regexp.MustCompile(`^\s+HTTP\s+http://(\S+)`)
	adminRe := regexp.MustCompile(`^\s+admin\s+http://(\S+)`)
	found := make(chan [2]string, 1)
	go func() {
		var h, a string
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := httpRe.FindStringSubmatch(sc.Text()); m != nil {
				h = m[1]
			}
			if m := adminRe.FindStringSubmatch(sc.Text()); m != nil {
				a = m[1]
			}
			if h != "" && a != "" {
				found <- [2]string{h, a}
				break
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	select {
	case addrs := <-found:
		return addrs[0], addrs[1]
	case <-exited:
		t.Fatalf("sluice demo exited before it was ready:\n%s", stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("sluice demo not ready within 30s:\n%s", stderr.String())
	}
	return "", ""
}

// load sends new sessions to addr at about 40 a second (more than the
// demo's MOP lets through, so some are refused) until ctx ends, at most
// 6000 requests.
func load(ctx context.Context, addr string) {
	client := &http.Client{Timeout: 2 * time.Second}
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for range 6000 {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		resp, err := client.Get("http://" + addr + "/")
		if err != nil {
			continue
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

type rowView struct {
	Key   string `json:"key"`
	State string `json:"state"`
	Class string `json:"cls"`
	Color string `json:"bg"`
	Drain string `json:"drain"`
}

const rowsJS = `[...document.querySelectorAll('#backends tbody tr')].map(tr => {
  const st = tr.querySelector('.c-state');
  return {key: tr.dataset.key, state: st.textContent, cls: st.className,
          bg: getComputedStyle(st).backgroundColor, drain: tr.querySelector('button.drain').textContent};
})`

// pixelsJS counts the pixels of a plot's canvas within 12 of an RGB colour:
// a series drawn in that colour, not just axes and grid.
const pixelsJS = `((key, rgb) => {
  const c = document.querySelector('.plot[data-plot="' + key + '"] canvas');
  if (!c) return -1;
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let n = 0;
  for (let i = 0; i < d.length; i += 4)
    if (d[i+3] > 200 && Math.abs(d[i]-rgb[0]) < 12 && Math.abs(d[i+1]-rgb[1]) < 12 && Math.abs(d[i+2]-rgb[2]) < 12) n++;
  return n;
})`

// TestDashboardInBrowser drives headless Chromium against `sluice demo`
// under load and checks what an operator sees: a row per backend in the
// right state and colour, plots that draw their series and move, and a
// drain button that turns the row and /status to draining.
//
// It skips when Chromium is missing, unless CI=true. Set
// SLUICE_DASHBOARD_SCREENSHOT=docs/img/dashboard.png (relative to the
// repository root) to refresh the README's screenshot.
func TestDashboardInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end browser test skipped in -short mode")
	}
	chromium := needChromium(t)
	httpAddr, adminAddr := startDemo(t)
	base := "http://" + adminAddr

	loadCtx, stopLoad := context.WithTimeout(context.Background(), 150*time.Second)
	var loaders sync.WaitGroup
	loaders.Go(func() { load(loadCtx, httpAddr) })
	defer func() { stopLoad(); loaders.Wait() }()

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.WindowSize(1280, 1000), chromedp.Flag("disable-dev-shm-usage", true))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	browser, cancelBrowser := chromedp.NewContext(allocCtx)
	defer cancelBrowser()
	// The first Run starts the browser and must not carry a deadline; the
	// steps after it do.
	if err := chromedp.Do(browser, chromedp.Navigate(base+"/")); err != nil {
		t.Fatalf("open dashboard: %v", err)
	}
	ctx, cancel := context.WithTimeout(browser, 150*time.Second)
	defer cancel()
	run := func(what string, a chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, a); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	samples := func() int {
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`Number(document.body.dataset.samples || 0)`))
		if err != nil {
			t.Fatalf("read sample count: %v", err)
		}
		return n
	}
	pixels := func(key string, rgb [3]int) int {
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](fmt.Sprintf("%s(%q, [%d,%d,%d])", pixelsJS, key, rgb[0], rgb[1], rgb[2])))
		if err != nil {
			t.Fatalf("read pixels of %s: %v", key, err)
		}
		return n
	}

	run("wait for four rows and three samples", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Poll[chromedp.Void](`document.querySelectorAll('#backends tbody tr').length === 4 && Number(document.body.dataset.samples) >= 3`,
			chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second))(ctx, tg)
		return err
	}))

	rows, err := chromedp.Run(ctx, chromedp.Evaluate[[]rowView](rowsJS))
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, r := range rows {
		keys = append(keys, r.Key)
		if r.State != "up" || r.Class != "c-state state state-up" || r.Color != "rgb(200, 230, 201)" || r.Drain != "drain" {
			t.Errorf("row %s: state %q class %q colour %s button %q; want up, state-up, green rgb(200, 230, 201), drain", r.Key, r.State, r.Class, r.Color, r.Drain)
		}
	}
	if want := []string{"http/h1", "http/h2", "sip/s1", "sip/s2"}; !slices.Equal(keys, want) {
		t.Errorf("rows = %v, want %v", keys, want)
	}

	// Series are drawn: the node's used memory, and on h1's plot the
	// admitted new work (the load) and MOP's allowed rate.
	for _, c := range []struct {
		plot, series string
		rgb          [3]int
	}{
		{"memory", "used MiB", [3]int{0x37, 0x47, 0x4f}},
		{"backend:http/h1", "allowed /s", [3]int{0x15, 0x65, 0xc0}},
		{"backend:http/h1", "admitted new /s", [3]int{0x2e, 0x7d, 0x32}},
	} {
		if n := pixels(c.plot, c.rgb); n < 20 {
			t.Errorf("plot %s: %d pixels of the %s series, want a drawn line (>= 20)", c.plot, n, c.series)
		}
	}

	// The plots move: two screenshots of the backend plots, two samples apart, differ.
	shot := func() []byte {
		b, err := chromedp.Run(ctx, chromedp.Screenshot(chromedp.CSS("#backend-plots")))
		if err != nil {
			t.Fatalf("screenshot: %v", err)
		}
		return b
	}
	before, n0 := shot(), samples()
	run("wait for two more samples", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Poll[chromedp.Void](fmt.Sprintf(`Number(document.body.dataset.samples) >= %d`, n0+2),
			chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(15*time.Second))(ctx, tg)
		return err
	}))
	if after := shot(); bytes.Equal(before, after) {
		t.Errorf("backend plots identical %d samples apart: they do not move", samples()-n0)
	}

	if path := os.Getenv("SLUICE_DASHBOARD_SCREENSHOT"); path != "" {
		// Let the picture fill in: 45 seconds of samples under load.
		run("wait for 45 samples", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Poll[chromedp.Void](`Number(document.body.dataset.samples) >= 45`,
				chromedp.WithPollingInterval(500*time.Millisecond), chromedp.WithPollingTimeout(60*time.Second))(ctx, tg)
			return err
		}))
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("full screenshot: %v", err)
		}
		if !filepath.IsAbs(path) {
			path = filepath.Join("..", path) // tests run in admin/
		}
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot of the demo under load: %s (%d bytes)", path, len(png))
	}

	// Drain h1 with its button: the row turns draining (yellow) and
	// /status agrees.
	run("click drain on http/h1", chromedp.Click(chromedp.CSS(`tr[data-key="http/h1"] button.drain`)))
	run("wait for the row to turn draining", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := chromedp.Poll[chromedp.Void](`document.querySelector('tr[data-key="http/h1"] .c-state').textContent === 'draining'`,
			chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(10*time.Second))(ctx, tg)
		return err
	}))
	rows, err = chromedp.Run(ctx, chromedp.Evaluate[[]rowView](rowsJS))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		switch {
		case r.Key == "http/h1" && (r.Class != "c-state state state-draining" || r.Color != "rgb(255, 243, 176)" || r.Drain != "undrain"):
			t.Errorf("drained row: class %q colour %s button %q; want state-draining, yellow rgb(255, 243, 176), undrain", r.Class, r.Color, r.Drain)
		case r.Key != "http/h1" && r.State != "up":
			t.Errorf("row %s is %s after draining h1, want up", r.Key, r.State)
		}
	}
	resp, err := http.Get(base + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct {
		Backends []struct {
			ID, Protocol, State string
		} `json:"backends"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	for _, b := range st.Backends {
		if want := map[bool]string{true: "draining", false: "up"}[b.Protocol == "http" && b.ID == "h1"]; b.State != want {
			t.Errorf("/status: %s %s is %s, want %s", b.Protocol, b.ID, b.State, want)
		}
	}
}

// TestAdminRebindingInBrowser drives headless Chromium as an attacker
// would against an admin listener on loopback without tokens: a page of
// another origin posts to it, and a page whose name resolves to 127.0.0.1
// (--host-resolver-rules, what DNS rebinding achieves) posts to it as its
// own origin. Neither changes anything: backend h2 stays enabled, and the
// rebound page reads nothing (421).
func TestAdminRebindingInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end browser test skipped in -short mode")
	}
	chromium := needChromium(t)
	h1, _ := lb.NewBackend(lb.BackendConfig{ID: "h1", Addr: "127.0.0.1:10001", Proto: "http"})
	h2, _ := lb.NewBackend(lb.BackendConfig{ID: "h2", Addr: "127.0.0.1:10002", Proto: "http"})
	pool, err := lb.NewPool(lb.PoolConfig{}, []*lb.Backend{h1, h2})
	if err != nil {
		t.Fatal(err)
	}
	srv := admin.New(nil)
	srv.Handle("GET /status", admin.StatusHandler(admin.Source{Backends: func() []admin.BackendStatus {
		var out []admin.BackendStatus
		for _, b := range pool.Backends() {
			out = append(out, admin.FromBackend(b.Status(0), nil))
		}
		return out
	}}))
	admin.RegisterControl(srv, admin.ControlConfig{Operator: admin.PoolControl(func() []*lb.Pool { return []*lb.Pool{pool} })})
	// A page standing for the dashboard: its script is fetched only when
	// the page is rendered, in a frame too.
	var scriptFetched atomic.Int32
	srv.Handle("GET /{$}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, `<!doctype html><title>admin</title><script src="/probe.js"></script><button>drain</button>`)
	}))
	srv.Handle("GET /probe.js", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scriptFetched.Add(1)
		w.Header().Set("Content-Type", "text/javascript")
		io.WriteString(w, "void 0;")
	}))
	if err := srv.AllowHosts("127.0.0.1:0", nil); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}()
	_, adminPort, _ := net.SplitHostPort(ln.Addr().String())
	adminURL := "http://127.0.0.1:" + adminPort

	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, "<!doctype html><title>cat pictures</title><p>nothing to see</p>")
	}))
	defer attacker.Close()
	_, attackerPort, _ := net.SplitHostPort(attacker.Listener.Addr().String())

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("host-resolver-rules", "MAP rebind.evil.example 127.0.0.1, MAP cats.evil.example 127.0.0.1"))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	browser, cancelBrowser := chromedp.NewContext(allocCtx)
	defer cancelBrowser()
	if err := chromedp.Do(browser, chromedp.Navigate("http://cats.evil.example:"+attackerPort+"/")); err != nil {
		t.Fatalf("open the attacker's page: %v", err)
	}
	ctx, cancel := context.WithTimeout(browser, 60*time.Second)
	defer cancel()

	// A page of another origin: a no-cors POST goes out, its answer is
	// opaque; the origin check must refuse it.
	crossJS := fmt.Sprintf(`(async () => {
  const out = [];
  try { await fetch(%[1]q + '/control/backends/h2/disable', {method: 'POST', mode: 'no-cors', body: new URLSearchParams({value: ''})}); out.push('posted'); }
  catch (e) { out.push('post failed'); }
  try { const r = await fetch(%[1]q + '/status'); out.push('read ' + r.status + ' ' + (await r.text()).length); }
  catch (e) { out.push('read blocked'); }
  return out.join('; ');
})()`, adminURL)
	got, err := chromedp.Run(ctx, chromedp.Evaluate[string](crossJS, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("cross-origin attack: %v", err)
	}
	t.Logf("page of another origin: %s", got)
	if strings.Contains(got, "read 200") {
		t.Errorf("a page of another origin read /status: %s", got)
	}
	if h2.Disabled() {
		t.Fatalf("a page of another origin disabled h2 (%s)", got)
	}

	// Clickjacking: the page frames the admin page to have its buttons
	// clicked; the frame must stay empty (the load event fires either way).
	frameJS := fmt.Sprintf(`new Promise((done) => {
  const f = document.createElement('iframe');
  f.onload = () => done('loaded');
  f.src = %q;
  document.body.appendChild(f);
})`, adminURL+"/")
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[string](frameJS, chromedp.EvalAwaitPromise)); err != nil {
		t.Fatalf("frame the admin page: %v", err)
	}
	if n := scriptFetched.Load(); n != 0 {
		t.Errorf("the admin page rendered in another site's frame (its script fetched %d times): its buttons can be clickjacked", n)
	}

	// The rebound name: for the browser the admin listener is the page's
	// own origin (Sec-Fetch-Site same-origin, Origin its own name).
	rebound := "http://rebind.evil.example:" + adminPort
	if err := chromedp.Do(ctx, chromedp.Navigate(rebound+"/")); err != nil {
		t.Fatalf("open the rebound name: %v", err)
	}
	const sameOriginJS = `(async () => {
  const out = [];
  try { const r = await fetch('/control/backends/h2/disable', {method: 'POST', body: new URLSearchParams({value: ''})}); out.push('post ' + r.status); }
  catch (e) { out.push('post failed'); }
  try { const r = await fetch('/status'); const t = await r.text(); out.push('read ' + r.status + (t.includes('10002') ? ' with the backends' : '')); }
  catch (e) { out.push('read failed'); }
  return out.join('; ');
})()`
	got, err = chromedp.Run(ctx, chromedp.Evaluate[string](sameOriginJS, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("rebinding attack: %v", err)
	}
	t.Logf("rebound page: %s", got)
	if got != "post 421; read 421" {
		t.Errorf("rebound page got %q, want %q", got, "post 421; read 421")
	}
	if h2.Disabled() {
		t.Fatalf("a page under a rebound name disabled h2 (%s)", got)
	}
	if n := srv.Misdirected(); n < 3 {
		t.Errorf("Misdirected() = %d, want at least 3 (the page, the POST, the read)", n)
	}
}

// TestDashboardNewestEventsInBrowser: with more events in the last 15
// minutes than the dashboard asks for (1,000), the page lists the newest
// (a backend that just went down) and says how many older ones it left
// out.
func TestDashboardNewestEventsInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end browser test skipped in -short mode")
	}
	chromium := needChromium(t)
	store, err := persist.Open(persist.Config{Dir: t.TempDir(), SweepInterval: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close(context.Background())
	// 1,200 events over the last 10 minutes (2 a second), the newest a
	// backend going down.
	now := time.Now()
	for i := range 1200 {
		ev := admission.Event{Time: now.Add(time.Duration(i-1200) * 500 * time.Millisecond), Kind: admission.EventARMRefusing,
			Subject: "invites", Message: fmt.Sprintf("refusing, event %d", i)}
		if i == 1199 {
			ev = admission.Event{Time: now, Kind: admission.EventBackendState, Subject: "http backend h1", Message: "h1 up -> down"}
		}
		store.Append(ev)
		if i%100 == 99 {
			if err := store.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	srv := admin.New(nil)
	srv.Handle("GET /events", store.EventsHandler())
	admin.NewDashboard(admin.DashboardConfig{}, nil).Register(srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}()

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.Flag("disable-dev-shm-usage", true))
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
		_, err := chromedp.Poll[chromedp.Void](`document.querySelectorAll('#events li').length > 0`,
			chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second))(ctx, tg)
		return err
	})); err != nil {
		t.Fatalf("wait for the event list: %v", err)
	}
	type view struct {
		Top     string `json:"top"`
		Omitted string `json:"omitted"`
		Hidden  bool   `json:"hidden"`
	}
	v, err := chromedp.Run(ctx, chromedp.Evaluate[view](`({top: document.querySelector('#events li').textContent,
  omitted: document.querySelector('#events-omitted') ? document.querySelector('#events-omitted').textContent : '',
  hidden: document.querySelector('#events-omitted') ? document.querySelector('#events-omitted').hidden : true})`))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(v.Top, "h1 up -> down") {
		t.Errorf("top of the event list %q, want the newest event, h1 going down", v.Top)
	}
	if v.Hidden || !strings.Contains(v.Omitted, "200 older events") {
		t.Errorf("omitted note %q (hidden %v), want it to say 200 older events were left out", v.Omitted, v.Hidden)
	}
}
