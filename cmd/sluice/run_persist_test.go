package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// waitExit waits up to limit for cmd to exit and returns its exit code
// and how long it took, failing the test past limit.
func waitExit(t *testing.T, cmd interface{ Wait() error }, limit time.Duration) (int, time.Duration) {
	t.Helper()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		code := 0
		if ee, ok := err.(interface{ ExitCode() int }); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("wait: %v", err)
		}
		return code, time.Since(start)
	case <-time.After(limit):
		t.Fatalf("sluice did not exit within %v", limit)
		return 0, 0
	}
}

// TestRunSIGTERMWithBrokenDataDir: the data directory vanishes while
// sluice serves (what a dead disk looks like); traffic still flows, the
// failure shows in /metrics and /status, and SIGTERM still ends the
// process within -drain-timeout plus a few seconds, with status 0.
func TestRunSIGTERMWithBrokenDataDir(t *testing.T) {
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }))
	defer be.Close()
	dir := filepath.Join(t.TempDir(), "data")
	cmd, addrs := startSluiceAddrs(t, "-http-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0", "-data-dir", dir,
		"-http-backend", be.Listener.Addr().String(), "-persist-interval", "50ms", "-drain-timeout", "1s")
	front, admin := "http://"+addrs["http"], "http://"+addrs["admin"]
	if err := os.Rename(dir, dir+".gone"); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir + ".gone"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "/metrics to report the failing data directory", func() bool {
		_, _, body := httpGet(t, admin+"/metrics")
		return strings.Contains(body, "sluice_persist_healthy 0")
	})
	_, _, body := httpGet(t, admin+"/status")
	var st struct {
		Storage struct {
			Healthy    bool   `json:"healthy"`
			SaveErrors int    `json:"save_errors"`
			LastError  string `json:"last_error"`
		} `json:"storage"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil || st.Storage.Healthy || st.Storage.SaveErrors == 0 || st.Storage.LastError == "" {
		t.Errorf("/status storage while the directory is gone: %s", body)
	}
	if code, _, got := httpGet(t, front+"/x"); code != 200 || got != "ok" {
		t.Errorf("traffic with a broken data directory: %d %q", code, got)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, took := waitExit(t, cmd, 1*time.Second+5*time.Second)
	if code != 0 {
		t.Errorf("exit status %d after SIGTERM, want 0", code)
	}
	t.Logf("exited %v after SIGTERM", took.Round(time.Millisecond))
}

// TestRunSecondSignalExitsAtOnce: while a drain waits for a request in
// flight, a second SIGTERM ends the process at once.
func TestRunSecondSignalExitsAtOnce(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			arrived <- struct{}{}
			select {
			case <-release:
			case <-time.After(60 * time.Second):
			}
		}
		fmt.Fprint(w, "ok")
	}))
	defer be.Close()
	defer close(release)
	cmd, addrs := startSluiceAddrs(t, "-http-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0", "-data-dir", t.TempDir(),
		"-http-backend", be.Listener.Addr().String(), "-drain-timeout", "60s")
	front, admin := "http://"+addrs["http"], "http://"+addrs["admin"]
	go func() {
		if resp, err := http.Get(front + "/slow"); err == nil {
			resp.Body.Close()
		}
	}()
	<-arrived
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the drain to start", func() bool {
		resp, err := http.Get(admin + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 429
	})
	// Another SIGTERM every 200 ms: the ones within a second of the
	// first are taken for the same stop delivered twice, a later one
	// is the operator asking again.
	stopSending := make(chan struct{})
	defer close(stopSending)
	go func() {
		for {
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-stopSending:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	code, took := waitExit(t, cmd, 5*time.Second) // the drain alone would take up to 60s
	if code == 0 {
		t.Errorf("exit status 0 after a second SIGTERM cut the drain short; want non-zero")
	}
	t.Logf("exited %v after the second SIGTERM, status %d", took.Round(time.Millisecond), code)
}

// TestRunRepeatedSignalDrains: one stop delivered twice at once (coreutils
// timeout signals the child and its process group) is one stop: the drain
// finishes the request in flight and the process exits 0, after its final
// save, not at once with status 1.
func TestRunRepeatedSignalDrains(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			arrived <- struct{}{}
			select {
			case <-release:
			case <-time.After(60 * time.Second):
			}
		}
		fmt.Fprint(w, "ok")
	}))
	defer be.Close()
	cmd, addrs := startSluiceAddrs(t, "-http-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0", "-data-dir", t.TempDir(),
		"-http-backend", be.Listener.Addr().String(), "-drain-timeout", "60s")
	front, admin := "http://"+addrs["http"], "http://"+addrs["admin"]
	got := make(chan int, 1)
	go func() {
		resp, err := http.Get(front + "/slow")
		if err != nil {
			got <- 0
			return
		}
		resp.Body.Close()
		got <- resp.StatusCode
	}()
	<-arrived
	for range 2 {
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "the drain to start", func() bool {
		resp, err := http.Get(admin + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 429
	})
	close(release)
	if code, _ := waitExit(t, cmd, 30*time.Second); code != 0 {
		t.Errorf("exit status %d after one stop delivered twice; want 0 (drained, saved)", code)
	}
	if st := <-got; st != 200 {
		t.Errorf("the request in flight got %d, want 200 (drained, not cut)", st)
	}
}
