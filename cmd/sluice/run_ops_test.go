package main

import (
	"bufio"
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
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestMain lets a test start this binary as sluice itself
// (SLUICE_TEST_MAIN=1), so that it can be killed with SIGKILL.
func TestMain(m *testing.M) {
	if os.Getenv("SLUICE_TEST_MAIN") == "1" {
		os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// waitFor polls cond every 20ms until it holds or limit passes.
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

func httpGet(t *testing.T, url string, header ...string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

type mopView struct {
	Phase       string  `json:"phase"`
	LearnedRate float64 `json:"learned_rate"`
	AllowedRate float64 `json:"allowed_rate"`
}

func backendMOP(t *testing.T, admin string) (mopView, bool) {
	resp, err := http.Get("http://" + admin + "/status")
	if err != nil {
		return mopView{}, false
	}
	defer resp.Body.Close()
	var st struct {
		Backends []struct {
			MOP mopView `json:"mop"`
		} `json:"backends"`
	}
	if json.NewDecoder(resp.Body).Decode(&st) != nil || len(st.Backends) == 0 {
		return mopView{}, false
	}
	return st.Backends[0].MOP, true
}

// startSluice runs this test binary as `sluice run` with args and returns
// it and the admin address it printed.
func startSluice(t *testing.T, args ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd, addrs := startSluiceAddrs(t, args...)
	return cmd, addrs["admin"]
}

// startSluiceAddrs is startSluice returning every address of the
// "listening" log line by name (http, sip, admin).
func startSluiceAddrs(t *testing.T, args ...string) (*exec.Cmd, map[string]string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"run"}, args...)...)
	cmd.Env = append(os.Environ(), "SLUICE_TEST_MAIN=1")
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { killAndReap(t, cmd) })
	found := make(chan map[string]string, 1)
	go func() {
		re := regexp.MustCompile(`(http|sip|admin)=([0-9.]+:[0-9]+)`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if !strings.Contains(sc.Text(), "msg=listening") {
				continue
			}
			addrs := map[string]string{}
			for _, m := range re.FindAllStringSubmatch(sc.Text(), -1) {
				addrs[m[1]] = m[2]
			}
			select {
			case found <- addrs:
			default:
			}
		}
	}()
	select {
	case a := <-found:
		return cmd, a
	case <-time.After(20 * time.Second):
		t.Fatal("sluice did not report its addresses")
	}
	return nil, nil
}

// TestKill9KeepsLearnedRate: learned MOP state survives kill -9; after the
// restart /status shows it again and MOP is not back in discovery.
func TestKill9KeepsLearnedRate(t *testing.T) {
	var usedPct atomic.Int64
	usedPct.Store(95) // over the 85% ceiling: MOP learns on the first sample
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"heap_used_bytes":%d,"heap_max_bytes":100}`, usedPct.Load())
			return
		}
		fmt.Fprint(w, "ok")
	}))
	defer be.Close()
	dir := t.TempDir()
	args := []string{"-http-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0", "-data-dir", dir,
		"-http-backend", be.Listener.Addr().String() + ",metrics=" + be.URL + "/metrics",
		"-mop-probe-interval", "50ms", "-persist-interval", "100ms", "-mop-initial-rate", "40"}
	cmd, admin := startSluice(t, args...)
	var before mopView
	waitFor(t, 10*time.Second, "MOP to learn", func() bool {
		v, ok := backendMOP(t, admin)
		before = v
		return ok && v.Phase == "learned"
	})
	waitStatesStored(t, admin, time.Now())
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	usedPct.Store(50) // nothing to cut after the restart
	_, admin = startSluice(t, args...)
	after, ok := backendMOP(t, admin)
	if !ok {
		t.Fatal("no /status after restart")
	}
	if after.Phase != "learned" || after.LearnedRate != before.LearnedRate || after.LearnedRate <= 0 || after.LearnedRate >= 40 {
		t.Errorf("after kill -9 and restart: %+v; before: %+v", after, before)
	}
}

func TestRunCorruptStoreStopsStartup(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "MANIFEST"), []byte("not a manifest"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var stderr syncBuffer
	code := run(ctx, []string{"-data-dir", dir, "-http-listen", "127.0.0.1:0", "-admin-listen", "", "-http-backend", "127.0.0.1:1"}, io.Discard, &stderr, nil)
	if code != 1 || !strings.Contains(stderr.String(), dir) || !strings.Contains(stderr.String(), "-data-reset") {
		t.Errorf("exit %d, stderr %q; want 1 and a message naming %s and -data-reset", code, stderr.String(), dir)
	}
	if _, err := os.Stat(filepath.Join(dir, "MANIFEST")); err != nil {
		t.Errorf("the corrupt store was touched: %v", err)
	}
	// With -data-reset the same directory starts afresh.
	stderr = syncBuffer{}
	code = run(ctx, []string{"-data-dir", dir, "-data-reset", "-http-listen", "127.0.0.1:0", "-admin-listen", "", "-http-backend", "127.0.0.1:1"},
		io.Discard, &stderr, &runHooks{ready: func(net.Addr, net.Addr) { cancel() }})
	if code != 0 {
		t.Errorf("with -data-reset: exit %d, stderr %q", code, stderr.String())
	}
}

// TestRunDrainOnSIGTERM: on shutdown, health turns 429 at once, new work is
// refused, affinity and the request in flight are served, exit 0.
func TestRunDrainOnSIGTERM(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			arrived <- struct{}{}
			<-release
		}
		fmt.Fprint(w, "done")
	}))
	defer be.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan [2]net.Addr, 1)
	exit := make(chan int, 1)
	var stderr syncBuffer
	go func() {
		exit <- run(ctx, []string{"-data-dir", t.TempDir(), "-http-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0",
			"-http-backend", be.Listener.Addr().String(), "-drain-timeout", "20s",
			"-arm", "name=w,limit=10/s,low=5/min"}, io.Discard, &stderr,
			&runHooks{ready: func(h, a net.Addr) { ready <- [2]net.Addr{h, a} }})
	}()
	var addrs [2]net.Addr
	select {
	case addrs = <-ready:
	case code := <-exit:
		t.Fatalf("run exited %d: %s", code, stderr.String())
	}
	front, admin := "http://"+addrs[0].String(), "http://"+addrs[1].String()
	code, hdr, _ := httpGet(t, front+"/first")
	cookie := hdr.Get("Set-Cookie")
	if code != 200 || !strings.HasPrefix(cookie, "SLUICE=") {
		t.Fatalf("first request: %d, Set-Cookie %q", code, cookie)
	}
	cookie = strings.SplitN(cookie, ";", 2)[0]

	// /events holds the warning about the ignored unit, written before the
	// store was open; /metrics exposes the families.
	if code, _, body := httpGet(t, admin+"/events?limit=50"); code != 200 || !strings.Contains(body, "config.warning") {
		t.Errorf("/events: %d %s", code, body)
	}
	if code, _, body := httpGet(t, admin+"/metrics"); code != 200 || !strings.Contains(body, `sluice_requests_admitted_total{class="new",protocol="http"} 1`) ||
		!strings.Contains(body, `sluice_forward_duration_seconds_count{protocol="http"} 1`) {
		t.Errorf("/metrics: %d\n%s", code, body)
	}

	slow := make(chan int, 1)
	go func() {
		resp, err := http.Get(front + "/slow")
		if err != nil {
			slow <- -1
			return
		}
		resp.Body.Close()
		slow <- resp.StatusCode
	}()
	<-arrived
	cancel() // what SIGTERM does
	waitFor(t, 5*time.Second, "health to turn 429", func() bool {
		code, _, _ := httpGet(t, admin+"/healthz")
		return code == 429
	})
	if code, hdr, _ := httpGet(t, front+"/new"); code != 503 || hdr.Get("Retry-After") == "" {
		t.Errorf("new work while draining: %d, Retry-After %q", code, hdr.Get("Retry-After"))
	}
	if code, _, body := httpGet(t, front+"/sticky", "Cookie", cookie); code != 200 || body != "done" {
		t.Errorf("affinity while draining: %d %q", code, body)
	}
	close(release)
	if code := <-slow; code != 200 {
		t.Errorf("in-flight request during drain: %d", code)
	}
	select {
	case code := <-exit:
		if code != 0 {
			t.Errorf("exit %d: %s", code, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not exit after the drain")
	}
}
