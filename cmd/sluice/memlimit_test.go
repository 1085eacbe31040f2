package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime/debug"
	"testing"
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
