package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicelb/sluice/internal/testenv"
)

// freePort returns a loopback address free for TCP and UDP, below the
// ephemeral range: these tests start sluice again on the same ports.
func freePort(t *testing.T) string { return testenv.FreePort(t) }

// startSluiceLog runs sluice with args and returns the process and the
// log lines it wrote up to and including "listening".
func startSluiceLog(t *testing.T, args ...string) (*exec.Cmd, []string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"run"}, args...)...)
	cmd.Env = append(os.Environ(), "SLUICE_TEST_MAIN=1")
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { killAndReap(t, cmd) })
	found := make(chan []string, 1)
	ended := make(chan []string, 1) // sluice closed its stderr (exited) first
	var mu sync.Mutex
	var lines []string
	go func() {
		sent := false
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if sent {
				continue // keep draining the pipe
			}
			mu.Lock()
			lines = append(lines, sc.Text())
			l := append([]string(nil), lines...)
			mu.Unlock()
			if strings.Contains(sc.Text(), "msg=listening") {
				found <- l
				sent = true
			}
		}
		if !sent {
			mu.Lock()
			ended <- append([]string(nil), lines...)
			mu.Unlock()
		}
	}()
	select {
	case l := <-found:
		return cmd, l
	case l := <-ended:
		t.Fatalf("sluice exited before it listened (%v); its log:\n%s", cmd.Wait(), strings.Join(l, "\n"))
	case <-time.After(20 * time.Second):
		mu.Lock()
		l := strings.Join(lines, "\n")
		mu.Unlock()
		t.Fatalf("sluice did not start listening within 20s; its log so far:\n%s", l)
	}
	return nil, nil
}

// outcome of one request of the restart load.
type outcome struct {
	sent, done time.Time
	answered   bool
	err        string
}

// recorder keeps every request's outcome.
type recorder struct {
	mu  sync.Mutex
	all []outcome
	why []string // the first requests lost after the restart
}

func (r *recorder) add(o outcome) {
	r.mu.Lock()
	r.all = append(r.all, o)
	r.mu.Unlock()
}

// tally splits the requests by when they were sent: before the kill
// (answered, or lost: in flight at the kill), in the gap (no listener)
// and after the restart.
func (r *recorder) tally(kill, ready time.Time) (before, lostAtKill, gap, gapAnswered, after, afterLost int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, o := range r.all {
		switch {
		case o.sent.Before(kill):
			before++
			if !o.answered {
				lostAtKill++
			}
		case o.sent.Before(ready):
			gap++
			if o.answered {
				gapAnswered++
			}
		default:
			after++
			if !o.answered {
				afterLost++
				if len(r.why) < 5 {
					r.why = append(r.why, fmt.Sprintf("sent %v after the restart, gave up after %v: %s", o.sent.Sub(ready).Round(time.Millisecond), o.done.Sub(o.sent).Round(time.Millisecond), o.err))
				}
			}
		}
	}
	return
}

// TestFaultKill9UnderLoad: sluice is killed with SIGKILL under HTTP and
// SIP load and started again on the same ports. The learned MOP rates are
// restored before the first listener opens, a SIP dialog set up before
// the kill is still routed by its token to its backend, a sticky HTTP
// client still reaches its backend, and the only requests lost are those
// in flight at the kill; every request sent after the restart is answered.
func TestFaultKill9UnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("starts sluice processes")
	}
	var used atomic.Int64
	used.Store(95) // over the 85% ceiling: MOP learns on the first sample
	httpBE := func(name string) *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/metrics" {
				fmt.Fprintf(w, `{"heap_used_bytes":%d,"heap_max_bytes":100}`, used.Load())
				return
			}
			io.WriteString(w, name)
		}))
		t.Cleanup(s.Close)
		return s
	}
	h1, h2 := httpBE("h1"), httpBE("h2")
	s1, s2 := newSIPBackend(t, false), newSIPBackend(t, false)
	httpAddr, sipAddr, adminAddr := freePort(t), freePort(t), freePort(t)
	dataDir := t.TempDir()
	args := []string{"-http-listen", httpAddr, "-sip-listen", sipAddr, "-admin-listen", adminAddr, "-data-dir", dataDir,
		"-http-backend", h1.Listener.Addr().String() + ",id=h1,metrics=" + h1.URL + "/metrics",
		"-http-backend", h2.Listener.Addr().String() + ",id=h2,metrics=" + h2.URL + "/metrics",
		"-sip-backend", s1.addr + ",id=s1", "-sip-backend", s2.addr + ",id=s2", "-sip-lb-policy", "round-robin",
		"-mop-probe-interval", "50ms", "-persist-interval", "100ms", "-mop-initial-rate", "2000", "-lb-policy", "round-robin"}
	cmd, _ := startSluiceLog(t, args...)

	waitFor(t, 10*time.Second, "MOP to learn on both HTTP backends", func() bool {
		r := learnedRates(t, adminAddr)
		return len(r) == 2 && r["h1"] > 0 && r["h2"] > 0
	})
	before := learnedRates(t, adminAddr)
	learnedAt := time.Now()

	// A sticky HTTP client and a SIP dialog, set up before the kill.
	code, hdr, home := httpGet(t, "http://"+httpAddr+"/first")
	cookie, _, _ := strings.Cut(hdr.Get("Set-Cookie"), ";")
	if code != 200 || !strings.HasPrefix(cookie, "SLUICE=") {
		t.Fatalf("first request: %d, Set-Cookie %q", code, hdr.Get("Set-Cookie"))
	}
	dlg := newSIPClient(t, sipAddr)
	ok := dlg.roundTrip(t, sipInvite(sipAddr, dlg.addr(), 424242))
	if !strings.HasPrefix(ok, "SIP/2.0 200") {
		t.Fatalf("INVITE before the kill: %q", ok)
	}
	rr := sipHeader(ok, "Record-Route")
	callID := "fault-424242@test"
	dialogOn := s1
	if s2.got("INVITE", callID) > 0 {
		dialogOn = s2
	}

	// Load, then kill -9 in the middle of it.
	var hrec, srec recorder
	stop := make(chan struct{})
	var wg sync.WaitGroup
	restartLoad(&wg, stop, &hrec, &srec, httpAddr, sipAddr, t)
	far := time.Now().Add(time.Hour)
	waitFor(t, 20*time.Second, "load to flow", func() bool {
		hb, _, _, _, _, _ := hrec.tally(far, far)
		sb, _, _, _, _, _ := srec.tally(far, far)
		return hb >= 100 && sb >= 100
	})
	waitStatesStored(t, adminAddr, learnedAt)
	kill := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	used.Store(50) // nothing to cut after the restart: the rates stay as learned
	_, lines := startSluiceLog(t, args...)
	ready := time.Now()
	restored := 0
	for _, l := range lines {
		if strings.Contains(l, "msg=\"learned rate restored\"") {
			restored++
		}
	}
	if restored < 2 {
		t.Errorf("%d learned rates restored before the listeners opened, want 2; log:\n%s", restored, strings.Join(lines, "\n"))
	}
	after := learnedRates(t, adminAddr)
	for id, r := range before {
		if after[id] != r {
			t.Errorf("learned rate of %s: %v before the kill, %v at the first /status after the restart", id, r, after[id])
		}
	}

	// Sticky client and dialog, after the restart.
	if code, _, got := httpGet(t, "http://"+httpAddr+"/again", "Cookie", cookie); code != 200 || got != home {
		t.Errorf("sticky client after restart: %d on %q, want %s", code, got, home)
	}
	bye := strings.Replace(sipInvite(sipAddr, dlg.addr(), 424242), "INVITE sip:", "BYE sip:", 1)
	bye = strings.Replace(bye, "CSeq: 1 INVITE", "CSeq: 2 BYE", 1)
	bye = strings.Replace(bye, "To: <sip:svc@test>", "To: <sip:svc@test>;tag=uas\r\nRoute: "+rr, 1)
	bye = strings.Replace(bye, "branch=z9hG4bK-f424242", "branch=z9hG4bK-bye424242", 1)
	if res := dlg.roundTrip(t, bye); !strings.HasPrefix(res, "SIP/2.0 200") || dialogOn.got("BYE", callID) != 1 {
		t.Errorf("BYE after restart: %q; on the INVITE's backend: %d", res, dialogOn.got("BYE", callID))
	}

	waitFor(t, 20*time.Second, "load after the restart", func() bool {
		_, _, _, _, ha, _ := hrec.tally(kill, ready)
		_, _, _, _, sa, _ := srec.tally(kill, ready)
		return ha >= 100 && sa >= 100
	})
	close(stop)
	wg.Wait()
	for _, x := range []struct {
		name string
		r    *recorder
	}{{"HTTP", &hrec}, {"SIP", &srec}} {
		b, lost, gap, gapOK, a, aLost := x.r.tally(kill, ready)
		t.Logf("%s: %d sent before the kill, %d of them lost (in flight at the kill); %d sent in the %v gap (%d answered); %d sent after the restart, %d lost",
			x.name, b, lost, gap, ready.Sub(kill).Round(time.Millisecond), gapOK, a, aLost)
		if b == 0 || a == 0 {
			t.Errorf("%s: no load before the kill or after the restart", x.name)
		}
		if aLost != 0 {
			t.Errorf("%s: %d requests sent after the restart were not answered: %q", x.name, aLost, x.r.why)
		}
		if lost > 16 { // at most one in flight per worker
			t.Errorf("%s: %d requests lost at the kill, more than the workers had in flight", x.name, lost)
		}
	}
}

// learnedRates returns the learned MOP rate of each backend by id.
func learnedRates(t *testing.T, admin string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/status")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var st struct {
		Backends []struct {
			ID  string `json:"id"`
			MOP struct {
				Phase       string  `json:"phase"`
				LearnedRate float64 `json:"learned_rate"`
			} `json:"mop"`
		} `json:"backends"`
	}
	out := map[string]float64{}
	if decodeJSON(resp.Body, &st) != nil {
		return nil
	}
	for _, b := range st.Backends {
		if b.MOP.Phase == "learned" {
			out[b.ID] = b.MOP.LearnedRate
		}
	}
	return out
}

// restartLoad runs 8 HTTP and 4 SIP workers, one request at a time each,
// until stop; a request unanswered within 3 s (SIP: 1 s) is counted
// unanswered.
func restartLoad(wg *sync.WaitGroup, stop <-chan struct{}, hrec, srec *recorder, httpAddr, sipAddr string, t *testing.T) {
	deadline := time.Now().Add(60 * time.Second)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{Timeout: 3 * time.Second}
			for i := 0; i < 1_000_000 && time.Now().Before(deadline); i++ {
				select {
				case <-stop:
					return
				default:
				}
				o := outcome{sent: time.Now()}
				if resp, err := c.Get("http://" + httpAddr + "/load"); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					o.answered = true
				} else {
					o.err = err.Error()
					time.Sleep(5 * time.Millisecond) // no listener: do not spin
				}
				o.done = time.Now()
				hrec.add(o)
			}
		}()
	}
	for w := range 4 {
		cl := newSIPClient(t, sipAddr)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1_000_000 && time.Now().Before(deadline); i++ {
				select {
				case <-stop:
					return
				default:
				}
				o := outcome{sent: time.Now()}
				res := cl.exchange(sipInvite(sipAddr, cl.addr(), (w+1)*1_000_000+i), time.Second)
				if res == "" {
					o.err = "no final answer within 1s"
				}
				o.answered, o.done = res != "", time.Now()
				srec.add(o)
			}
		}()
	}
}

// sipClient is a UDP SIP client socket.
type sipClient struct {
	c   *net.UDPConn
	dst *net.UDPAddr
}

func newSIPClient(t *testing.T, lb string) *sipClient {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	dst, err := net.ResolveUDPAddr("udp", lb)
	if err != nil {
		t.Fatal(err)
	}
	return &sipClient{c: c, dst: dst}
}

func (s *sipClient) addr() string { return s.c.LocalAddr().String() }

// exchange sends msg and returns the first final response within limit,
// or "" (stale answers to earlier requests are skipped by Call-ID).
func (s *sipClient) exchange(msg string, limit time.Duration) string {
	if _, err := s.c.WriteToUDP([]byte(msg), s.dst); err != nil {
		return ""
	}
	callID := sipHeader(msg, "Call-ID")
	buf := make([]byte, 65536)
	deadline := time.Now().Add(limit)
	for {
		s.c.SetReadDeadline(deadline)
		n, _, err := s.c.ReadFromUDP(buf)
		if err != nil {
			return ""
		}
		res := string(buf[:n])
		if strings.HasPrefix(res, "SIP/2.0 1") || sipHeader(res, "Call-ID") != callID {
			continue
		}
		return res
	}
}

func (s *sipClient) roundTrip(t *testing.T, msg string) string {
	t.Helper()
	res := s.exchange(msg, 5*time.Second)
	if res == "" {
		t.Fatalf("no final answer to:\n%s", msg)
	}
	return res
}

func decodeJSON(r io.Reader, v any) error { return json.NewDecoder(r).Decode(v) }
