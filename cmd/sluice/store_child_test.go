package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// storeChild returns the pid of the store process of sluice pid (its
// child running `store-child`), 0 when there is none.
func storeChild(t *testing.T, parent int) int {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(parent) || f[0] == "Z" {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "cmdline"))
		if strings.Contains(string(cmdline), "store-child") {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			return pid
		}
	}
	return 0
}

// killAndReap kills sluice with SIGKILL, reaps it, and waits (at most 5 s)
// for its store process, which outlives it by up to 2 s while it commits
// what its sockets hold: a test's temporary data directory removed before
// that races the store's last writes ("directory not empty"). The store
// process is found before the kill: once orphaned it is no longer
// sluice's child.
func killAndReap(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if cmd.Process == nil {
		return
	}
	child := storeChild(t, cmd.Process.Pid)
	cmd.Process.Kill()
	cmd.Wait()
	for end := time.Now().Add(5 * time.Second); child != 0 && alive(child) && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

func metric(t *testing.T, admin, name string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + name + ` ([0-9.e+]+)$`).FindStringSubmatch(adminBody(t, admin, "/metrics"))
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// TestStoreProcessKilledUnderLoad: the store process of `sluice run`
// killed with SIGKILL and SIGBUS while HTTP requests flow: no request
// fails, sluice sees each death (/metrics, an event naming the signal),
// starts a new store process with backoff, reports healthy again, and
// SIGTERM then ends sluice and its store process within the bound.
func TestStoreProcessKilledUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("starts sluice processes")
	}
	dir := t.TempDir()
	cmd, a := startSluiceAddrs(t, "-http-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0", "-data-dir", dir,
		"-http-backend", okBackend(t), "-persist-interval", "50ms", "-drain-timeout", "1s")
	var ok, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	c := &http.Client{Timeout: 5 * time.Second}
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := c.Get("http://" + a["http"] + "/x")
				if err != nil {
					failed.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 200 {
					ok.Add(1)
				} else {
					failed.Add(1)
				}
			}
		}()
	}
	for i, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGBUS} {
		var pid int
		waitFor(t, 20*time.Second, "a store process", func() bool { pid = storeChild(t, cmd.Process.Pid); return pid != 0 })
		waitFor(t, 20*time.Second, "store healthy", func() bool { return metric(t, a["admin"], "sluice_persist_healthy") == 1 })
		before := ok.Load()
		syscall.Kill(pid, sig)
		waitFor(t, 20*time.Second, "the death seen", func() bool {
			return metric(t, a["admin"], "sluice_persist_child_restarts_total") == float64(i+1)
		})
		waitFor(t, 20*time.Second, "requests answered after the death", func() bool { return ok.Load() > before+100 })
		waitFor(t, 20*time.Second, "a new store process (1 s backoff)", func() bool {
			p := storeChild(t, cmd.Process.Pid)
			return p != 0 && p != pid && metric(t, a["admin"], "sluice_persist_healthy") == 1
		})
	}
	close(stop)
	wg.Wait()
	if failed.Load() != 0 {
		t.Errorf("%d requests failed (%d answered) while the store process was killed", failed.Load(), ok.Load())
	}
	body := adminBody(t, a["admin"], "/events?type=persist.child_died")
	for _, want := range []string{`"subject": "SIGKILL"`, `"subject": "SIGBUS"`} {
		if !strings.Contains(body, want) {
			t.Errorf("/events?type=persist.child_died lacks %s:\n%s", want, body)
		}
	}
	if st := adminBody(t, a["admin"], "/status"); !strings.Contains(st, `"child": "running"`) || !strings.Contains(st, `"child_restarts": 2`) {
		t.Errorf("/status storage does not show the store process: %s", st)
	}
	child := storeChild(t, cmd.Process.Pid)
	code, took := signalExit(t, cmd.Process, func() (int, time.Duration) { return waitExit(t, cmd, 15*time.Second) }, syscall.SIGTERM)
	if code != 0 {
		t.Errorf("exit status %d after SIGTERM", code)
	}
	t.Logf("%d requests answered, exited %v after SIGTERM", ok.Load(), took.Round(time.Millisecond))
	waitFor(t, 5*time.Second, "the store process to end with sluice", func() bool { return !alive(child) })
}

// TestStoreProcessEndsWithKilledParent: kill -9 of sluice ends its store
// process too (parent-death signal, and EOF of its socket).
func TestStoreProcessEndsWithKilledParent(t *testing.T) {
	if testing.Short() {
		t.Skip("starts sluice processes")
	}
	cmd, _ := startSluiceAddrs(t, "-http-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0", "-data-dir", t.TempDir(),
		"-http-backend", okBackend(t))
	var pid int
	waitFor(t, 20*time.Second, "a store process", func() bool { pid = storeChild(t, cmd.Process.Pid); return pid != 0 })
	cmd.Process.Kill()
	cmd.Wait()
	waitFor(t, 5*time.Second, "the store process to end", func() bool { return !alive(pid) })
}

// TestSIGTERMWithStoreProcessHung: a store process that answers nothing
// (stopped with SIGSTOP, as one stuck on a dead disk) does not hold up
// SIGTERM: sluice exits within the bound and the store process ends.
func TestSIGTERMWithStoreProcessHung(t *testing.T) {
	if testing.Short() {
		t.Skip("starts sluice processes")
	}
	cmd, a := startSluiceAddrs(t, "-http-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0", "-data-dir", t.TempDir(),
		"-http-backend", okBackend(t), "-persist-interval", "50ms", "-drain-timeout", "1s")
	var pid int
	waitFor(t, 20*time.Second, "a store process", func() bool { pid = storeChild(t, cmd.Process.Pid); return pid != 0 })
	syscall.Kill(pid, syscall.SIGSTOP)
	adminBody(t, a["admin"], "/status")
	code, took := signalExit(t, cmd.Process, func() (int, time.Duration) { return waitExit(t, cmd, 15*time.Second) }, syscall.SIGTERM)
	t.Logf("exit status %d %v after SIGTERM with the store process stopped", code, took.Round(time.Millisecond))
	waitFor(t, 5*time.Second, "the stopped store process to end", func() bool { return !alive(pid) })
}

// waitStatesStored waits until the store process acknowledged two writes
// of learned states after after (storage.mop_saved_at in /status): the
// second was exported after after, so it holds what was learned by then.
func waitStatesStored(t *testing.T, admin string, after time.Time) {
	t.Helper()
	savedAt := func() time.Time {
		var st struct {
			Storage struct {
				MOPSavedAt time.Time `json:"mop_saved_at"`
			} `json:"storage"`
		}
		json.Unmarshal([]byte(adminBody(t, admin, "/status")), &st)
		return st.Storage.MOPSavedAt
	}
	var first time.Time
	waitFor(t, 20*time.Second, "the learned states stored", func() bool {
		at := savedAt()
		if first.IsZero() {
			if at.After(after) {
				first = at
			}
			return false
		}
		return at.After(first)
	})
}

// TestEventsCommandReadsRunningSluice: while sluice holds the data
// directory, `sluice events --type` reads the log from its admin
// listener, selected by type.
func TestEventsCommandReadsRunningSluice(t *testing.T) {
	if testing.Short() {
		t.Skip("starts sluice processes")
	}
	dir := t.TempDir()
	cmd, a := startSluiceAddrs(t, "-http-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0", "-data-dir", dir,
		"-http-backend", okBackend(t))
	var pid int
	waitFor(t, 20*time.Second, "a store process", func() bool { pid = storeChild(t, cmd.Process.Pid); return pid != 0 })
	syscall.Kill(pid, syscall.SIGKILL)
	waitFor(t, 20*time.Second, "the store process back", func() bool {
		return metric(t, a["admin"], "sluice_persist_child_restarts_total") == 1 && metric(t, a["admin"], "sluice_persist_healthy") == 1
	})
	var stdout, stderr strings.Builder
	code := runEvents([]string{"--data-dir", dir, "--admin-listen", a["admin"], "--type", "persist.child_died", "--since", "1h"}, &stdout, &stderr)
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if code != 0 || len(lines) != 1 || !strings.Contains(lines[0], "persist.child_died") || !strings.Contains(lines[0], "SIGKILL") {
		t.Errorf("exit %d, stdout %q, stderr %q; want one persist.child_died line naming SIGKILL", code, stdout.String(), stderr.String())
	}
}

// TestStoreProcessIgnoresGroupSignals: SIGTERM, SIGINT and SIGHUP sent to
// sluice's process group (systemctl stop with KillMode=control-group,
// Ctrl-C) reached the store process too, which died of it as the drain
// began: an error "store process died ... check the disk", and the final
// save waited for a new one. The store process now ignores them: it
// still stores (two writes acknowledged after the signals, by the same
// process, with no restart), and ends with sluice.
func TestStoreProcessIgnoresGroupSignals(t *testing.T) {
	if testing.Short() {
		t.Skip("starts sluice processes")
	}
	// A backend whose MOP state is saved every -persist-interval.
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"heap_used_bytes":10,"heap_max_bytes":100}`)
			return
		}
		fmt.Fprint(w, "ok")
	}))
	defer be.Close()
	cmd, a := startSluiceAddrs(t, "-http-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0", "-data-dir", t.TempDir(),
		"-http-backend", be.Listener.Addr().String()+",metrics="+be.URL+"/metrics", "-mop-probe-interval", "50ms",
		"-persist-interval", "50ms", "-drain-timeout", "1s")
	var pid int
	waitFor(t, 20*time.Second, "a store process", func() bool { pid = storeChild(t, cmd.Process.Pid); return pid != 0 })
	waitFor(t, 20*time.Second, "store healthy", func() bool { return metric(t, a["admin"], "sluice_persist_healthy") == 1 })
	// The store process yields to the balancer on wake-up (SCHED_BATCH,
	// every thread); the balancer keeps the normal policy.
	if pol := schedPolicies(t, pid); len(pol) == 0 || slices.ContainsFunc(pol, func(p int) bool { return p != schedBatch }) {
		t.Errorf("store process threads' policies %v, want all %d (SCHED_BATCH)", pol, schedBatch)
	}
	if pol := schedPolicies(t, cmd.Process.Pid); len(pol) == 0 || slices.Contains(pol, schedBatch) {
		t.Errorf("balancer threads' policies %v, want none SCHED_BATCH", pol)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP} {
		if err := syscall.Kill(pid, sig); err != nil {
			t.Fatal(err)
		}
	}
	waitStatesStored(t, a["admin"], time.Now())
	if p := storeChild(t, cmd.Process.Pid); p != pid || !alive(pid) {
		t.Errorf("store process %d after the signals, was %d (alive %v)", p, pid, alive(pid))
	}
	if n := metric(t, a["admin"], "sluice_persist_child_restarts_total"); n != 0 {
		t.Errorf("%v store process restarts after group signals, want 0", n)
	}
	code, _ := signalExit(t, cmd.Process, func() (int, time.Duration) { return waitExit(t, cmd, 15*time.Second) }, syscall.SIGTERM)
	if code != 0 {
		t.Errorf("exit status %d after SIGTERM", code)
	}
	waitFor(t, 5*time.Second, "the store process to end with sluice", func() bool { return !alive(pid) })
}

// schedBatch is Linux's SCHED_BATCH.
const schedBatch = 3

// schedPolicies returns the scheduling policy of each thread of pid, from
// /proc/PID/task/TID/sched ("policy : N").
func schedPolicies(t *testing.T, pid int) []int {
	t.Helper()
	files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/sched", pid))
	var out []int
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // the thread ended
		}
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "policy" {
				n, err := strconv.Atoi(strings.TrimSpace(v))
				if err != nil {
					t.Fatalf("%s: policy %q", f, v)
				}
				out = append(out, n)
			}
		}
	}
	return out
}
