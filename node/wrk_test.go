package node

import (
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicelb/sluice/internal/testenv"
)

// wrkRun is wrk loading a URL in the background, started and stopped by
// its process id.
type wrkRun struct {
	cmd  *exec.Cmd
	out  syncBuffer
	done chan error
}

// startWrk starts wrk on url with args (which bound its duration); the
// test skips (fails in CI) when wrk is not installed. wrk still running
// at the test's end is killed.
func startWrk(t *testing.T, url string, args ...string) *wrkRun {
	t.Helper()
	path := testenv.Tool(t, "wrk", "wrk")
	w := &wrkRun{done: make(chan error, 1)}
	w.cmd = exec.Command(path, append(args, url)...)
	w.cmd.Stdout, w.cmd.Stderr = &w.out, &w.out
	if err := w.cmd.Start(); err != nil {
		t.Fatalf("wrk: %v", err)
	}
	go func() { w.done <- w.cmd.Wait() }()
	t.Cleanup(func() {
		if w.cmd.ProcessState == nil {
			_ = w.cmd.Process.Kill()
			<-w.done
		}
	})
	return w
}

// stop interrupts wrk (SIGINT to its pid: it ends its run and prints
// its summary) and returns the summary; ranOut reports that wrk had
// ended by itself first, its duration over before the test's load was.
func (w *wrkRun) stop(t *testing.T) (summary string, ranOut bool) {
	t.Helper()
	select {
	case err := <-w.done:
		if err != nil {
			t.Fatalf("wrk: %v\n%s", err, w.out.String())
		}
		return w.out.String(), true
	default:
	}
	if err := syscall.Kill(w.cmd.Process.Pid, syscall.SIGINT); err != nil && err != syscall.ESRCH {
		t.Fatalf("interrupt wrk (pid %d): %v", w.cmd.Process.Pid, err)
	}
	select {
	case err := <-w.done:
		if err != nil && !isInterrupted(err) {
			t.Fatalf("wrk: %v\n%s", err, w.out.String())
		}
	case <-time.After(10 * time.Second):
		_ = w.cmd.Process.Kill()
		<-w.done
		t.Fatalf("wrk (pid %d) did not end 10 s after SIGINT:\n%s", w.cmd.Process.Pid, w.out.String())
	}
	return w.out.String(), false
}

// isInterrupted: wrk ended by the SIGINT it was sent.
func isInterrupted(err error) bool {
	ee, ok := err.(*exec.ExitError)
	if !ok {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == os.Interrupt
}

var wrkRequests = regexp.MustCompile(`(\d+) requests in`)

// wrkResult is what a wrk summary says: the requests it completed and
// its failures (socket errors, answers other than 2xx/3xx), "" when none.
func wrkResult(summary string) (requests int, failures string) {
	if m := wrkRequests.FindStringSubmatch(summary); m != nil {
		requests, _ = strconv.Atoi(m[1])
	}
	var bad []string
	for _, line := range strings.Split(summary, "\n") {
		if l := strings.TrimSpace(line); strings.HasPrefix(l, "Socket errors") || strings.HasPrefix(l, "Non-2xx") {
			bad = append(bad, l)
		}
	}
	return requests, strings.Join(bad, "; ")
}

// TestWrkResult: the summary lines that count as failures, from wrk
// 4.2's output.
func TestWrkResult(t *testing.T) {
	const clean = "Running 30s test @ http://127.0.0.1:8080/\n  1 threads and 4 connections\n  Thread Stats   Avg      Stdev     Max   +/- Stdev\n    Latency   512.00us  100.00us   2.00ms   90.00%\n    Req/Sec     7.80k   300.00     8.20k    70.00%\n  23456 requests in 3.00s, 3.10MB read\nRequests/sec:   7818.67\nTransfer/sec:      1.03MB\n"
	for _, tc := range []struct {
		name, summary string
		requests      int
		failures      string
	}{
		{"clean", clean, 23456, ""},
		{"socket errors", strings.Replace(clean, "Requests/sec", "  Socket errors: connect 0, read 3, write 0, timeout 0\nRequests/sec", 1), 23456, "Socket errors: connect 0, read 3, write 0, timeout 0"},
		{"non-2xx", strings.Replace(clean, "Requests/sec", "  Non-2xx or 3xx responses: 12\nRequests/sec", 1), 23456, "Non-2xx or 3xx responses: 12"},
		{"no run", "unable to connect to 127.0.0.1:8080 Connection refused\n", 0, ""},
	} {
		n, f := wrkResult(tc.summary)
		if n != tc.requests || f != tc.failures {
			t.Errorf("%s: %d requests, failures %q; want %d, %q", tc.name, n, f, tc.requests, tc.failures)
		}
	}
}
