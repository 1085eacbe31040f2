//go:build linux

package http

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	nethttp "net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fdChildLimit is the descriptor limit of the child process of
// TestDescriptorExhaustion.
const fdChildLimit = 256

// TestFDChild is the child process of TestDescriptorExhaustion: with
// SLUICE_FD_CHILD=engine,max-conns,per-source it lowers its descriptor
// limit, serves a rig and a stand-in admin listener (/healthz), prints
// their addresses, and on the end of stdin prints the connections closed
// over the limits and exits. It logs at warn level to stderr.
func TestFDChild(t *testing.T) {
	spec := os.Getenv("SLUICE_FD_CHILD")
	if spec == "" {
		t.Skip("the child process of TestDescriptorExhaustion")
	}
	f := strings.Split(spec, ",")
	maxConns, _ := strconv.Atoi(f[1])
	perSource, _ := strconv.Atoi(f[2])
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: fdChildLimit, Max: fdChildLimit}); err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	r := newRig(t, rigOpts{backends: 1, logger: logger, cfg: Config{Engine: f[0], MaxClientConns: maxConns, MaxConnsPerSource: perSource, StickyCookie: "-"}})
	aln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	admin := &nethttp.Server{Handler: nethttp.HandlerFunc(func(w nethttp.ResponseWriter, _ *nethttp.Request) { io.WriteString(w, "ok") })}
	go admin.Serve(aln)
	defer admin.Close()
	fmt.Printf("READY %s %s\n", r.addr, aln.Addr())
	io.Copy(io.Discard, os.Stdin)
	fmt.Printf("LIMITED %d\n", r.srv.Stats().ConnLimited.Load())
	os.Exit(0) // no clean-up: the parent has what it needs
}

// TestDescriptorExhaustion runs the front end in a child process limited
// to 256 descriptors and opens 300 idle client connections to it.
//
//   - With the default limits (derived from the descriptor limit) the
//     connections over them are closed at once, the admin listener still
//     answers, and once the idle clients leave a request gets 200.
//   - With limits set far above the descriptor limit, accept fails with
//     EMFILE: the loop backs off and logs the failure at most once a
//     second (it logged millions of lines in seconds, retrying at once),
//     and once the clients leave a request gets 200.
func TestDescriptorExhaustion(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		engine := engineOf(t)
		t.Run("derived limits", func(t *testing.T) {
			failures, limited := fdChild(t, engine, 0, 0, true)
			if failures != 0 || limited == 0 {
				t.Errorf("accept failures logged %d, connections closed over the limits %d; want 0 and some", failures, limited)
			}
		})
		t.Run("limits over the descriptor limit", func(t *testing.T) {
			if failures, _ := fdChild(t, engine, 100000, 100000, false); failures > 20 {
				t.Errorf("%d accept-failure lines logged, want at most 20 (one a second)", failures)
			}
		})
	})
}

// fdChild runs TestFDChild, fills it with idle connections, checks the
// admin listener (when admin) and the recovery, and returns the
// accept-failure lines it logged and the connections it closed over the
// limits.
func fdChild(t *testing.T, engine string, maxConns, perSource int, admin bool) (failures, limited int) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestFDChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), fmt.Sprintf("SLUICE_FD_CHILD=%s,%d,%d", engine, maxConns, perSource))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := false
	defer func() {
		if !done {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	out := bufio.NewScanner(stdout)
	var addr, adminAddr string
	for out.Scan() {
		if f := strings.Fields(out.Text()); len(f) == 3 && f[0] == "READY" {
			addr, adminAddr = f[1], f[2]
			break
		}
	}
	if addr == "" {
		t.Fatalf("child did not start: %s", stderr.String())
	}
	var idle []net.Conn
	for range 300 {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			break
		}
		idle = append(idle, c)
	}
	if !admin {
		// Wait until the child has used up its descriptors (at most 100
		// looks), so that its accepts fail from here on.
		for i := 0; i < 100 && openFDsOf(cmd.Process.Pid) < fdChildLimit-4; i++ {
			time.Sleep(20 * time.Millisecond)
		}
		if n := openFDsOf(cmd.Process.Pid); n < fdChildLimit-4 {
			t.Fatalf("the child holds %d descriptors, want its limit (%d)", n, fdChildLimit)
		}
		// The idle clients stay a moment: a loop that retried accept at
		// once would log thousands of failures meanwhile; one that backs
		// off logs one a second.
		time.Sleep(500 * time.Millisecond)
	}
	client := &nethttp.Client{Timeout: 5 * time.Second, Transport: &nethttp.Transport{DisableKeepAlives: true}}
	if admin {
		resp, err := client.Get("http://" + adminAddr + "/healthz")
		if err != nil {
			t.Errorf("admin listener with %d idle clients: %v", len(idle), err)
		} else {
			resp.Body.Close()
		}
	}
	for _, c := range idle {
		c.Close()
	}
	// The clients are gone: a request gets 200, within at most 100 tries
	// (the front end sees the closes as it gets to them).
	var status int
	for i := 0; i < 100 && status != 200; i++ {
		if resp, err := client.Get("http://" + addr + "/"); err == nil {
			status = resp.StatusCode
			resp.Body.Close()
		}
		if status != 200 {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if status != 200 {
		t.Errorf("after the idle clients left: status %d, want 200", status)
	}
	stdin.Close()
	for out.Scan() {
		if f := strings.Fields(out.Text()); len(f) == 2 && f[0] == "LIMITED" {
			limited, _ = strconv.Atoi(f[1])
		}
	}
	cmd.Wait()
	done = true
	failures = strings.Count(stderr.String(), "http accept failed")
	t.Logf("%s: %d idle connections opened, %d closed over the limits, %d accept-failure lines", engine, len(idle), limited, failures)
	return failures, limited
}

// openFDsOf returns the number of descriptors process pid holds.
func openFDsOf(pid int) int {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents)
}
