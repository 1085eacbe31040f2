package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDemoBackendsHoldMemory: the demo starts the balancer in front of its
// backends, and each new session through it grows its backend's memory as
// MOP sees it.
func TestDemoBackendsHoldMemory(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan [2]net.Addr, 1)
	exit := make(chan int, 1)
	var stdout, stderr syncBuffer
	go func() {
		exit <- demoMain(ctx, []string{"-http-listen", "127.0.0.1:0", "-sip-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0",
			"-data-dir", t.TempDir(), "-mop-probe-interval", "50ms", "-mop-initial-rate", "1000"}, &stdout, &stderr,
			&runHooks{ready: func(h, a net.Addr) { ready <- [2]net.Addr{h, a} }})
	}()
	var addrs [2]net.Addr
	select {
	case addrs = <-ready:
	case code := <-exit:
		t.Fatalf("demo exited %d: %s", code, stderr.String())
	}
	if out := stdout.String(); !strings.Contains(out, "curl") || !strings.Contains(out, "wrk") || !strings.Contains(out, "sipp") {
		t.Errorf("demo printed no ready-to-paste commands:\n%s", out)
	}
	memory := func() (total float64, n int) {
		resp, err := http.Get("http://" + addrs[1].String() + "/status")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var st struct {
			Backends []struct {
				Protocol string `json:"protocol"`
				MOP      struct {
					MemoryPercent float64 `json:"memory_percent"`
				} `json:"mop"`
			} `json:"backends"`
		}
		json.NewDecoder(resp.Body).Decode(&st)
		for _, b := range st.Backends {
			if b.Protocol == "http" {
				total += b.MOP.MemoryPercent
				n++
			}
		}
		return total, n
	}
	before, n := memory()
	if n != 2 {
		t.Fatalf("/status lists %d HTTP backends, want 2", n)
	}
	const sessions = 100 // 100 × 64 KiB = 6.25 MiB of 2 × 64 MiB: about 10 points in all
	for i := 0; i < sessions; i++ {
		resp, err := http.Get("http://" + addrs[0].String() + "/")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), "new session") {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
	}
	waitFor(t, 10*time.Second, "backend memory to grow by the sessions held", func() bool {
		after, _ := memory()
		return after-before >= 9
	})
	cancel()
	select {
	case <-exit:
	case <-time.After(20 * time.Second):
		t.Fatal("demo did not stop")
	}
}

// TestDemoDefaultsYieldToUser: a demo default is left out when the user
// sets that flag on the command line, in its SLUICE_* twin or in the
// -config file, so the user's value (or its error) is the one in force.
func TestDemoDefaultsYieldToUser(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.conf")
	os.WriteFile(file, []byte("# demo\nmop-window 20s\n"), 0o600)
	env := map[string]string{"SLUICE_MEM_LIMIT": "abc"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	got := strings.Join(demoDefaultsFor([]string{"-http-listen=127.0.0.1:0", "-config", file}, lookup), " ")
	for _, gone := range []string{"-http-listen", "-mem-limit", "-mop-window"} {
		if strings.Contains(got, gone+" ") {
			t.Errorf("default %s kept though the user set it: %s", gone, got)
		}
	}
	for _, kept := range []string{"-sip-listen", "-admin-listen", "-mop-initial-rate"} {
		if !strings.Contains(got, kept+" ") {
			t.Errorf("default %s dropped: %s", kept, got)
		}
	}
	// The user's bad value now reaches the parser and stops start-up.
	code := demoMain(context.Background(), []string{"-http-listen", "127.0.0.1:0", "-sip-listen", "127.0.0.1:0", "-admin-listen", "", "-mop-window", "nope"}, io.Discard, io.Discard, nil)
	if code != 2 {
		t.Errorf("demo with -mop-window nope exited %d, want 2", code)
	}
}
