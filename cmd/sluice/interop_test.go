package main

import (
	"context"
	"fmt"
	"github.com/sluicelb/sluice/internal/testenv"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
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
	for i := range 2 {
		name := fmt.Sprintf("b%d", i)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, name) }))
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
	_, hdr, _ := httpGet(t, url)
	cookie := strings.SplitN(hdr.Get("Set-Cookie"), ";", 2)[0]

	reqs := regexp.MustCompile(`(\d+) requests in`)
	for _, tc := range []struct {
		name  string
		extra []string
	}{
		{"new work", nil},
		{"sticky", []string{"-H", "Cookie: " + cookie}},
	} {
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
		t.Logf("%s: %s requests in 3 s", tc.name, m[1])
	}
	cancel()
	select {
	case <-exit:
	case <-time.After(15 * time.Second):
		t.Fatal("run did not stop")
	}
}
