package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestDemoFirstRun is a newcomer's first run: `sluice demo`, then the
// commands its banner prints, as printed but shortened in time. Below the
// demo backends' capacity nothing fails: the printed sipp scenario
// (built-in uac, which ignores Record-Route) completes every call, the
// printed curl keeps its session, and new HTTP sessions at a modest rate
// all get 200. Above capacity (the printed wrk, every request new work)
// only new work is refused, always with 503 or 429 and Retry-After, while
// a sticky session running alongside gets 200 every time. Then SIGINT
// drains and the demo exits 0.
func TestDemoFirstRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo with sipp and wrk for about 40 s")
	}
	needTool(t, "sipp")
	needTool(t, "wrk")
	sipPort := freeUDPTCPPort(t)
	cmd := exec.Command(os.Args[0], "demo", "-http-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0",
		"-sip-listen", fmt.Sprintf("127.0.0.1:%d", sipPort), "-data-dir", t.TempDir(), "-log-level", "warn")
	cmd.Env = append(os.Environ(), "SLUICE_TEST_MAIN=1")
	stdout, _ := cmd.StdoutPipe()
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { killAndReap(t, cmd) })
	banner := readBanner(t, stdout)
	cmds := map[string]string{}
	for _, line := range strings.Split(banner, "\n") {
		line = strings.TrimSpace(line)
		if i := strings.Index(line, "#"); i > 0 {
			line = strings.TrimSpace(line[:i])
		}
		for _, tool := range []string{"sipp", "wrk", "curl"} {
			if strings.HasPrefix(line, tool+" ") && cmds[tool] == "" {
				cmds[tool] = line
			}
		}
	}
	for _, tool := range []string{"sipp", "wrk", "curl"} {
		if cmds[tool] == "" {
			t.Fatalf("the banner prints no %s command:\n%s", tool, banner)
		}
	}
	httpURL := regexp.MustCompile(`http://[0-9.]+:[0-9]+/`).FindString(cmds["curl"])

	t.Run("sipp as printed", func(t *testing.T) {
		// As printed, with -m cut to 200 calls (10 s at the printed rate).
		args := strings.Fields(cmds["sipp"])[1:]
		for i := range args {
			if args[i] == "-m" && i+1 < len(args) {
				args[i+1] = "200"
			}
		}
		stat := filepath.Join(t.TempDir(), "stat.csv")
		args = append(args, "-p", strconv.Itoa(freeUDPTCPPort(t)), "-timeout", "60s", "-timeout_error",
			"-trace_stat", "-stf", stat, "-nostdin")
		out, err := exec.Command("sipp", args...).CombinedOutput()
		created, ok, failed := sippCounts(t, stat)
		t.Logf("sipp %s: created %d, successful %d, failed %d", strings.Join(args, " "), created, ok, failed)
		if err != nil || created != 200 || ok != 200 || failed != 0 {
			t.Fatalf("sipp: %v; created %d successful %d failed %d, want 200/200/0\n%s", err, created, ok, failed, tail(string(out), 2000))
		}
	})

	t.Run("curl as printed", func(t *testing.T) {
		jar := filepath.Join(t.TempDir(), "jar")
		args := strings.Fields(strings.ReplaceAll(cmds["curl"], "/tmp/sluice.jar", jar))[1:]
		var backends []string
		for i := range 5 {
			out, err := exec.Command("curl", args...).Output()
			if err != nil {
				t.Fatalf("curl %d: %v", i, err)
			}
			status := strings.Fields(string(out))
			if len(status) < 2 || status[1] != "200" {
				t.Fatalf("curl %d: %q", i, tail(string(out), 300))
			}
			// The demo backend's body names itself and the session:
			// "h1 new session ID" on the first request, "h1 session ID"
			// after.
			m := regexp.MustCompile(`(?m)^(\S+) (new )?session (\S+)$`).FindStringSubmatch(string(out))
			if m == nil {
				t.Fatalf("curl %d: no backend and session in the answer: %q", i, tail(string(out), 300))
			}
			if (i == 0) != (m[2] != "") {
				t.Fatalf("curl %d: %q: want a new session on the first request only", i, m[0])
			}
			backends = append(backends, m[1]+" "+m[3])
		}
		for _, b := range backends {
			if b != backends[0] {
				t.Fatalf("the session moved between backends or sessions: %v", backends)
			}
		}
	})

	t.Run("new sessions below capacity", func(t *testing.T) {
		// 10 new sessions a second for 5 s, each with a fresh client.
		for i := range 50 {
			resp, err := http.Get(httpURL)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("new session %d: %d (Proxy-Status %q)", i, resp.StatusCode, resp.Header.Get("Proxy-Status"))
			}
			time.Sleep(100 * time.Millisecond)
		}
	})

	t.Run("wrk as printed, above capacity", func(t *testing.T) {
		args := strings.Fields(cmds["wrk"])[1:]
		for i := range args {
			if strings.HasPrefix(args[i], "-d") {
				args[i] = "-d8s"
			}
		}
		jar, _ := cookiejar.New(nil)
		sticky := &http.Client{Jar: jar, Timeout: 5 * time.Second}
		if resp, err := sticky.Get(httpURL); err != nil || resp.StatusCode != 200 {
			t.Fatalf("opening the sticky session: %v %v", resp, err)
		} else {
			resp.Body.Close()
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		var stickyOK, stickyBad, newOK, refused int
		var bad []string
		wg.Add(2)
		go func() { // the session under way: always served
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
				resp, err := sticky.Get(httpURL)
				mu.Lock()
				if err != nil || resp.StatusCode != 200 {
					stickyBad++
					bad = append(bad, fmt.Sprintf("sticky: %v %v", statusOf(resp), err))
				} else {
					stickyOK++
				}
				mu.Unlock()
				if resp != nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
		}()
		go func() { // new work alongside wrk: 200, or a refusal with Retry-After
			defer wg.Done()
			c := &http.Client{Timeout: 5 * time.Second}
			for {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
				resp, err := c.Get(httpURL)
				mu.Lock()
				switch {
				case err != nil:
					bad = append(bad, fmt.Sprintf("new work: %v", err))
				case resp.StatusCode == 200:
					newOK++
				case (resp.StatusCode == 503 || resp.StatusCode == 429) && resp.Header.Get("Retry-After") != "":
					refused++
				default:
					bad = append(bad, fmt.Sprintf("new work: %d Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After")))
				}
				mu.Unlock()
				if resp != nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
		}()
		out, err := exec.Command("wrk", args...).CombinedOutput()
		close(stop)
		wg.Wait()
		t.Logf("wrk %s:\n%s", strings.Join(args, " "), out)
		t.Logf("alongside: sticky %d ok, %d failed; new work %d ok, %d refused", stickyOK, stickyBad, newOK, refused)
		if err != nil {
			t.Fatalf("wrk: %v", err)
		}
		if m := regexp.MustCompile(`Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`).FindStringSubmatch(string(out)); m != nil {
			t.Errorf("wrk saw socket errors: %s", m[0])
		}
		if len(bad) > 0 || stickyOK == 0 {
			t.Fatalf("%d bad answers (sticky ok %d): %v", len(bad), stickyOK, bad[:min(len(bad), 10)])
		}
	})

	cmd.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("demo exit after SIGINT: %v\n%s", err, tail(stderr.String(), 2000))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("demo did not exit within 30 s of SIGINT")
	}
}

// readBanner reads the demo's stdout up to the line that ends its banner
// and keeps draining the rest.
func readBanner(t *testing.T, r io.Reader) string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(r)
		var b strings.Builder
		sent := false
		for sc.Scan() {
			b.WriteString(sc.Text() + "\n")
			if !sent && strings.HasPrefix(sc.Text(), "Stop with") {
				got <- b.String()
				sent = true
			}
		}
		if !sent {
			got <- b.String()
		}
	}()
	select {
	case s := <-got:
		return s
	case <-time.After(30 * time.Second):
		t.Fatal("the demo printed no banner within 30 s")
	}
	return ""
}

// freeUDPTCPPort returns a loopback port free for both UDP and TCP.
func freeUDPTCPPort(t *testing.T) int {
	t.Helper()
	for range 50 {
		u, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		port := u.LocalAddr().(*net.UDPAddr).Port
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		u.Close()
		if err == nil {
			l.Close()
			return port
		}
	}
	t.Fatal("no free UDP+TCP port")
	return 0
}

// sippCounts reads the last line of sipp's -trace_stat file.
func sippCounts(t *testing.T, path string) (created, ok, failed int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("sipp stats: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) < 2 {
		t.Fatalf("sipp stats: %d lines", len(lines))
	}
	head, last := strings.Split(lines[0], ";"), strings.Split(lines[len(lines)-1], ";")
	col := func(name string) int {
		for i, h := range head {
			if h == name && i < len(last) {
				n, _ := strconv.Atoi(last[i])
				return n
			}
		}
		t.Fatalf("sipp stats: no column %s", name)
		return 0
	}
	return col("TotalCallCreated"), col("SuccessfulCall(C)"), col("FailedCall(C)")
}

func statusOf(resp *http.Response) string {
	if resp == nil {
		return "no answer"
	}
	return resp.Status
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
