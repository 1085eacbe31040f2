package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

// TestRunMemLimitSetsGoLimit: -mem-limit gives the Go runtime a memory limit
// at the Low share, so the runtime collects and returns memory before the
// states climb; the previous limit comes back when run returns.
func TestRunMemLimitSetsGoLimit(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	before := debug.SetMemoryLimit(-1)
	args := []string{"-http-backend", srv.Listener.Addr().String(), "-http-listen", "127.0.0.1:0",
		"-admin-listen", "127.0.0.1:0", "-data-dir", t.TempDir(), "-mem-limit", "1GiB", "-mem-low", "0.5",
		"-mem-lower", "0.6", "-mem-critical", "0.7"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan struct{}, 1)
	done := make(chan int, 1)
	var stderr syncBuffer
	go func() {
		done <- run(ctx, args, io.Discard, &stderr, &runHooks{ready: func(h, a net.Addr) { ready <- struct{}{} }})
	}()
	select {
	case <-ready:
	case code := <-done:
		t.Fatalf("run exited %d: %s", code, stderr.String())
	}
	if got, want := debug.SetMemoryLimit(-1), int64(1<<30)/2; got != want {
		t.Errorf("go memory limit while running = %d, want %d (low share of -mem-limit)", got, want)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("run exited %d: %s", code, stderr.String())
	}
	if got := debug.SetMemoryLimit(-1); got != before {
		t.Errorf("go memory limit after run = %d, want %d restored", got, before)
	}
}

var pressure [][]byte

// TestRunMemoryPressureAndBack drives the node memory states with real
// memory in the sluice process: live slabs push it through Low, Lower and
// Critical (/healthz 429, new work refused with Retry-After, a sticky
// session still served), and once the slabs are dropped the state is back
// to Normal within seconds. Regression for new work refused for up to four
// minutes after a burst, with no load at all: garbage counted as used and
// only the runtime's two-minute forced collection gave it back.
func TestRunMemoryPressureAndBack(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates about 200 MiB")
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer srv.Close()
	const limit = 256 << 20
	args := []string{"-http-backend", srv.Listener.Addr().String(), "-http-listen", "127.0.0.1:0",
		"-admin-listen", "127.0.0.1:0", "-data-dir", t.TempDir(), "-mem-limit", "256MiB"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan [2]net.Addr, 1)
	done := make(chan int, 1)
	var stderr syncBuffer
	go func() {
		done <- run(ctx, args, io.Discard, &stderr, &runHooks{ready: func(h, a net.Addr) { ready <- [2]net.Addr{h, a} }})
	}()
	var addrs [2]net.Addr
	select {
	case addrs = <-ready:
	case code := <-done:
		t.Fatalf("run exited %d: %s", code, stderr.String())
	}
	client := &http.Client{Timeout: 5 * time.Second}
	get := func(url, cookie string) (int, http.Header, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		if cookie != "" {
			req.Header.Set("Cookie", cookie)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, strings.TrimSpace(string(b))
	}
	front, admin := "http://"+addrs[0].String()+"/", "http://"+addrs[1].String()
	code, hdr, _ := get(front, "")
	if code != 200 {
		t.Fatalf("before pressure: %d", code)
	}
	sticky, _, _ := strings.Cut(hdr.Get("Set-Cookie"), ";")
	if !strings.HasPrefix(sticky, "SLUICE=") {
		t.Fatalf("no sticky cookie: %v", hdr)
	}
	// Add 8 MiB slabs until Critical, noting every state on the way.
	seen := []string{}
	state := func() string {
		time.Sleep(250 * time.Millisecond) // a few samples (every 100 ms)
		_, _, s := get(admin+"/healthz", "")
		return s
	}
	for i := 0; i < 40; i++ {
		s := state()
		if len(seen) == 0 || seen[len(seen)-1] != s {
			seen = append(seen, s)
		}
		if s == "critical" {
			break
		}
		if s == "lower" {
			// New work refused with Retry-After; the sticky session passes.
			if code, hdr, _ := get(front, ""); code != 429 || hdr.Get("Retry-After") == "" {
				t.Errorf("new work in lower: %d Retry-After %q, want 429 with one", code, hdr.Get("Retry-After"))
			}
			if code, _, _ := get(front, sticky); code != 200 {
				t.Errorf("sticky session in lower: %d, want 200", code)
			}
		}
		slab := make([]byte, 8<<20)
		for j := 0; j < len(slab); j += 4096 {
			slab[j] = 1
		}
		pressure = append(pressure, slab)
	}
	t.Logf("states under pressure: %v (%d MiB of slabs, limit %d MiB)", seen, len(pressure)*8, limit>>20)
	if want := []string{"normal", "low", "lower", "critical"}; strings.Join(seen, ",") != strings.Join(want, ",") {
		t.Errorf("states %v, want %v", seen, want)
	}
	if code, hdr, _ := get(admin+"/healthz", ""); code != 429 || hdr.Get("Retry-After") == "" {
		t.Errorf("/healthz in critical: %d, Retry-After %q", code, hdr.Get("Retry-After"))
	}
	if code, _, _ := get(front, sticky); code != 200 {
		t.Errorf("sticky session in critical: %d, want 200", code)
	}
	// Pressure ends: the slabs become garbage and nothing else happens.
	pressure = nil
	start := time.Now()
	var back time.Duration
	for time.Since(start) < 20*time.Second {
		if _, _, s := get(admin+"/healthz", ""); s == "normal" {
			back = time.Since(start)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if back == 0 {
		t.Fatalf("still not normal 20s after the pressure ended (the runtime's forced collection comes only every 2 minutes)")
	}
	t.Logf("back to normal %v after the pressure ended", back.Round(10*time.Millisecond))
	if code, _, _ := get(front, ""); code != 200 {
		t.Errorf("new work after the pressure: %d, want 200", code)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("run exited %d: %s", code, stderr.String())
	}
}
