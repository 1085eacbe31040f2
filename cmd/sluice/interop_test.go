package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicelb/sluice/internal/testenv"
)

// needTool skips a test whose external tool is missing, except in CI,
// where the test command installs it first and a skip would hide a gap.
func needTool(t *testing.T, name string) string {
	t.Helper()
	return testenv.Tool(t, name, name)
}

// TestWrkInterop drives `sluice run` with wrk on loopback, as users
// benchmark it, for new work and for sticky traffic: every answer must be
// a 200, with no socket errors. Bounded: two 3 s runs at 20 connections.
func TestWrkInterop(t *testing.T) {
	if testing.Short() {
		t.Skip("load test")
	}
	wrk := needTool(t, "wrk")
	var args []string
	// served counts, per backend, the requests that were not health probes.
	var served [2]atomic.Int64
	for i := range 2 {
		name := fmt.Sprintf("b%d", i)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("User-Agent") != "sluice-health" {
				served[i].Add(1)
			}
			io.WriteString(w, name)
		}))
		defer srv.Close()
		args = append(args, "-http-backend", srv.Listener.Addr().String()+",id="+name)
	}
	args = append(args, "-http-listen", "127.0.0.1:0", "-admin-listen", "", "-data-dir", t.TempDir(), "-drain-timeout", "1s")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan net.Addr, 1)
	exit := make(chan int, 1)
	var stderr syncBuffer
	go func() {
		exit <- run(ctx, args, io.Discard, &stderr, &runHooks{ready: func(h, _ net.Addr) { ready <- h }})
	}()
	var addr net.Addr
	select {
	case addr = <-ready:
	case code := <-exit:
		t.Fatalf("run exited %d: %s", code, stderr.String())
	}
	url := "http://" + addr.String() + "/"
	_, hdr, pinned := httpGet(t, url)
	cookie := strings.SplitN(hdr.Get("Set-Cookie"), ";", 2)[0]
	if !strings.HasPrefix(cookie, "SLUICE=") || len(cookie) <= len("SLUICE=") {
		t.Fatalf("the first answer set no sticky cookie: Set-Cookie %q", hdr.Get("Set-Cookie"))
	}
	other := 1
	if pinned == "b1" {
		other = 0
	} else if pinned != "b0" {
		t.Fatalf("first answer from %q, want b0 or b1", pinned)
	}

	reqs := regexp.MustCompile(`(\d+) requests in`)
	for _, tc := range []struct {
		name  string
		extra []string
	}{
		{"new work", nil},
		{"sticky", []string{"-H", "Cookie: " + cookie}},
	} {
		before := [2]int64{served[0].Load(), served[1].Load()}
		cmdArgs := append([]string{"-t1", "-c20", "-d3s", "--timeout", "2s"}, tc.extra...)
		out, err := exec.Command(wrk, append(cmdArgs, url)...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: wrk: %v\n%s", tc.name, err, out)
		}
		s := string(out)
		m := reqs.FindStringSubmatch(s)
		if m == nil || m[1] == "0" {
			t.Fatalf("%s: wrk made no requests:\n%s", tc.name, s)
		}
		if strings.Contains(s, "Non-2xx") || strings.Contains(s, "Socket errors") {
			t.Errorf("%s: wrk saw failures:\n%s", tc.name, s)
		}
		got := [2]int64{served[0].Load() - before[0], served[1].Load() - before[1]}
		n, _ := strconv.ParseInt(m[1], 10, 64)
		if got[0]+got[1] < n {
			t.Errorf("%s: wrk counted %d requests, the backends served %v", tc.name, n, got)
		}
		switch tc.name {
		case "sticky":
			// Every request carried the cookie: all of them on its backend,
			// but for a GET whose exchange with it broke before a byte of
			// answer (a keep-alive connection the backend closed) and was
			// sent once more to the other (seen once in 14,462 under CI
			// load); at most one in a thousand.
			if got[other] > n/1000 {
				t.Errorf("sticky: %d of %d requests went to b%d, not to the pinned %s", got[other], n, other, pinned)
			}
		case "new work":
			// New work is balanced: both backends take some.
			if got[0] == 0 || got[1] == 0 {
				t.Errorf("new work: served %v, want both backends used", got)
			}
		}
		t.Logf("%s: %s requests in 3 s, backends served %v", tc.name, m[1], got)
	}
	cancel()
	select {
	case <-exit:
	case <-time.After(15 * time.Second):
		t.Fatal("run did not stop")
	}
}
