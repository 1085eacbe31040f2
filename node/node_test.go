package node

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
	lbhttp "github.com/sluicelb/sluice/http"
	"github.com/sluicelb/sluice/lb"
	"github.com/sluicelb/sluice/persist"
	lbsip "github.com/sluicelb/sluice/sip"
)

// testConfig is a node on loopback ports the kernel picks, without admin
// listener or health checks, storing in a fresh directory.
func testConfig(t *testing.T) Config {
	return Config{
		HTTP:          lbhttp.Config{Listen: "127.0.0.1:0", StickyTTL: time.Hour, AppCookieTTL: time.Minute, AppCookieMax: 10, MaxConns: 8, ConnectTimeout: time.Second, BackendTimeout: 5 * time.Second, BackendIdle: time.Second, ClientReadTimeout: 5 * time.Second, ClientIdle: 5 * time.Second, StreamThreshold: 1 << 20},
		Policy:        lb.DefaultPolicy,
		Health:        lb.HealthConfig{Timeout: time.Second, Rise: 1, Fall: 1},
		Passive:       lb.PassiveConfig{Cooldown: time.Second},
		MOP:           admission.MOPConfig{MaxHeap: 0.85, Window: 10 * time.Second, InitialRate: 40},
		MOPRejectCode: 503,
		MOPProbe:      lb.MemoryProbeConfig{Interval: 20 * time.Millisecond, MaxBytes: lb.MaxMetricsWire},
		Persist:       persist.Config{Dir: filepath.Join(t.TempDir(), "data"), Interval: time.Hour},
		DrainTimeout:  5 * time.Second,
		SIP:           lbsip.Config{Listen: "127.0.0.1:0"},
	}
}

func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s after %v", what, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// memoryReport is a backend's /metrics in the JSON form the probe reads,
// at 95% of its maximum: over MOP's 85% ceiling, so MOP learns at once.
func memoryReport(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"heap_used_bytes":95,"heap_max_bytes":100}`)
}

// TestNodeServesAndStops drives a node in-process: it forwards to its
// backend, drains (health 429, new work refused) and stops.
func TestNodeServesAndStops(t *testing.T) {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello") }))
	defer be.Close()
	cfg := testConfig(t)
	cfg.HTTPBackends = []string{be.Listener.Addr().String() + ",id=b1"}
	cfg.AdminListen = "127.0.0.1:0"
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	a := n.Addrs()
	if a.HTTP == nil || a.Admin == nil || a.SIP != nil {
		t.Fatalf("addrs %+v: want HTTP and admin, no SIP", a)
	}
	get := func(url string) (int, string) {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("http://" + a.HTTP.String() + "/"); code != 200 || body != "hello" {
		t.Fatalf("forwarded: %d %q", code, body)
	}
	if code, _ := get("http://" + a.Admin.String() + "/healthz"); code != 200 {
		t.Fatalf("healthz before drain: %d", code)
	}
	drained := make(chan struct{})
	go func() { n.Drain(3 * time.Second); close(drained) }()
	waitFor(t, 3*time.Second, "health to turn 429", func() bool { code, _ := get("http://" + a.Admin.String() + "/healthz"); return code == 429 })
	if code, _ := get("http://" + a.HTTP.String() + "/"); code != 503 {
		t.Errorf("new work while draining: %d, want 503", code)
	}
	<-drained
	n.Stop(time.Second)
	if _, err := http.Get("http://" + a.HTTP.String() + "/"); err == nil {
		t.Error("HTTP front end still answers after Stop")
	}
}

// TestSIPMemoryProbeFeedsMOP: the memory probe of a SIP backend feeds the
// MOP of the backend the front end selects from (no stand-in backend), at
// start and after a reload that adds a backend.
func TestSIPMemoryProbeFeedsMOP(t *testing.T) {
	metrics := httptest.NewServer(http.HandlerFunc(memoryReport))
	defer metrics.Close()
	file := filepath.Join(t.TempDir(), "backends")
	if err := os.WriteFile(file, []byte("# none yet\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.SIPBackends = []string{"127.0.0.1:1,id=s1,metrics=" + metrics.URL}
	cfg.BackendsFile = file
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer n.Stop(time.Second)
	learned := func(id string) func() bool {
		return func() bool {
			for _, b := range n.backendStatus() {
				if b.ID == id && b.Protocol == "sip" && b.MOP.Phase == "learned" {
					return true
				}
			}
			return false
		}
	}
	waitFor(t, 5*time.Second, "s1's MOP to learn from its probe", learned("s1"))
	if err := os.WriteFile(file, []byte("sip 127.0.0.1:2,id=s2,metrics="+metrics.URL+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := n.Reload(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "s2's MOP to learn after the reload", learned("s2"))
	var ids []string
	for _, b := range n.backendStatus() {
		ids = append(ids, b.ID)
	}
	if strings.Join(ids, " ") != "s1 s2" {
		t.Errorf("backends after reload: %v", ids)
	}
	if !learned("s1")() {
		t.Error("s1 lost what it learned across the reload")
	}
	// A bad file changes nothing and says so in the event log.
	if err := os.WriteFile(file, []byte("sip 127.0.0.1:2,id=s2,wieght=3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := n.Reload(); err == nil {
		t.Fatal("a bad backends file was accepted")
	}
	n.store.Flush()
	evs, err := n.store.Events(time.Time{}, 1000)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, ev := range evs {
		found = found || (ev.Kind == admission.EventConfigReload && strings.Contains(ev.Message, "not reloaded"))
	}
	if !found {
		t.Errorf("no config.reload event for the failed reload in %d events", len(evs))
	}
}

// TestMemoryLimitSource: /status names where the memory limit comes from;
// the Low share of -mem-limit is the Go runtime's memory limit while the
// node runs, and the previous one is back after Stop. Without -mem-limit the
// limit is the machine's cgroup or GOMEMLIMIT, as DetectLimit finds it.
func TestMemoryLimitSource(t *testing.T) {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer be.Close()
	status := func(n *Node) (int64, string) {
		var st struct {
			Memory struct {
				LimitBytes  int64  `json:"limit_bytes"`
				LimitSource string `json:"limit_source"`
			} `json:"memory"`
		}
		resp, err := http.Get("http://" + n.Addrs().Admin.String() + "/status")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			t.Fatal(err)
		}
		return st.Memory.LimitBytes, st.Memory.LimitSource
	}
	start := func(limit int64) *Node {
		cfg := testConfig(t)
		cfg.HTTPBackends = []string{be.Listener.Addr().String()}
		cfg.AdminListen = "127.0.0.1:0"
		cfg.Memory.Limit = limit
		n, err := New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		return n
	}

	before := debug.SetMemoryLimit(-1)
	const limit = 3 << 30
	n := start(limit)
	waitFor(t, 5*time.Second, "the first memory sample", func() bool { l, _ := status(n); return l != 0 })
	if l, src := status(n); l != limit || src != "-mem-limit" {
		t.Errorf("/status memory limit %d from %q, want %d from -mem-limit", l, src, limit)
	}
	if got, want := debug.SetMemoryLimit(-1), (admission.MemoryConfig{Limit: limit}).RuntimeLimit(); got != want {
		t.Errorf("runtime memory limit %d while running, want %d (the Low share)", got, want)
	}
	n.Stop(time.Second)
	if got := debug.SetMemoryLimit(-1); got != before {
		t.Errorf("runtime memory limit %d after Stop, want %d back", got, before)
	}

	wantLimit, wantSource := admission.DetectLimit(os.DirFS("/"), before)
	n = start(0)
	defer n.Stop(time.Second)
	waitFor(t, 5*time.Second, fmt.Sprintf("/status to show %d bytes from %q", wantLimit, wantSource), func() bool {
		l, src := status(n)
		return l == wantLimit && src == wantSource
	})
}

// TestDataKeyWrittenBack: the affinity key generated in the data
// directory is written back when the file vanishes while the node runs,
// so a restart keeps the sticky sessions and dialogs it signed.
func TestDataKeyWrittenBack(t *testing.T) {
	cfg := testConfig(t)
	cfg.HTTPBackends = []string{"127.0.0.1:9,id=b1"}
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer n.Stop(time.Second)
	file := filepath.Join(cfg.Persist.Dir, persist.AffinityKeyFile)
	before, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(file)
	n.restoreDataKey()
	after, err := os.ReadFile(file)
	if err != nil || !bytes.Equal(before, after) {
		t.Fatalf("key file after it vanished: %v, same bytes %v", err, bytes.Equal(before, after))
	}
}

// TestDrainTimeout: -drain-timeout 0 is a node without a shutdown drain
// (new work refused, then it stops); a negative one is refused by name.
func TestDrainTimeout(t *testing.T) {
	for _, tc := range []struct {
		drain   time.Duration
		wantErr string
	}{
		{0, ""},
		{time.Second, ""},
		{-time.Second, "-drain-timeout must not be negative"},
	} {
		cfg := testConfig(t)
		cfg.HTTPBackends = []string{"127.0.0.1:1"}
		cfg.DrainTimeout = tc.drain
		n, err := New(cfg, nil)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("drain %s: err %v, want %q", tc.drain, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("drain %s: %v", tc.drain, err)
		}
		if tc.drain == 0 {
			if left := n.Drain(0); left != time.Second || !n.ctrl.Draining() {
				t.Errorf("Drain(0) = %s, draining %v; want 1s left for Stop and new work refused", left, n.ctrl.Draining())
			}
		}
	}
}

// TestStatusSIPSection: /status has a sip section with the dialog table,
// transactions, connections and dialog store when there is a SIP front
// end, and none without one.
func TestStatusSIPSection(t *testing.T) {
	status := func(n *Node) map[string]json.RawMessage {
		resp, err := http.Get("http://" + n.Addrs().Admin.String() + "/status")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var st map[string]json.RawMessage
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	for _, withSIP := range []bool{true, false} {
		cfg := testConfig(t)
		cfg.AdminListen = "127.0.0.1:0"
		if withSIP {
			cfg.SIPBackends = []string{"127.0.0.1:1,id=s1"}
		} else {
			be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
			defer be.Close()
			cfg.HTTPBackends = []string{be.Listener.Addr().String()}
		}
		n, err := New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		raw, ok := status(n)["sip"]
		n.Stop(time.Second)
		if !withSIP {
			if ok {
				t.Errorf("/status has a sip section without a SIP front end: %s", raw)
			}
			continue
		}
		var sip lbsip.Status
		if !ok || json.Unmarshal(raw, &sip) != nil {
			t.Fatalf("/status sip section %q", raw)
		}
		if sip.Dialogs.Max != lbsip.DefaultDialogMax || sip.Connections == nil || len(sip.Connections) != 4 {
			t.Errorf("/status sip section %s: want the dialog table's max %d and four connection kinds", raw, lbsip.DefaultDialogMax)
		}
	}
}

// TestDrainWaitsForTunnels: an open tunnel (a WebSocket) is a session under
// way: the drain does not end early around it ("drained" after the quiet
// period while a tunnel was still open), and when the timeout comes it
// says the tunnels are closed now.
func TestDrainWaitsForTunnels(t *testing.T) {
	for _, tunnels := range []int64{0, 1} {
		cfg := testConfig(t)
		cfg.HTTPBackends = []string{"127.0.0.1:1"}
		var logs syncBuffer
		n, err := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
		if err != nil {
			t.Fatal(err)
		}
		n.httpSrv.Stats().Tunnels.Add(tunnels)
		n.Drain(drainQuiet + 500*time.Millisecond)
		out := logs.String()
		timedOut := strings.Contains(out, "drain timeout reached: open tunnels are closed now")
		drained := strings.Contains(out, "msg=drained")
		if tunnels > 0 && (!timedOut || drained || !strings.Contains(out, "tunnels=1")) {
			t.Errorf("one tunnel open: logs %q, want the timeout naming the tunnel and no drained line", out)
		}
		if tunnels == 0 && (!drained || timedOut) {
			t.Errorf("no tunnel: logs %q, want drained after the quiet period", out)
		}
	}
}
