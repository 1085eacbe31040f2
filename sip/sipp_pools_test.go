package sip

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// sippRun is one SIPp client run: its command, started, and what it
// wrote.
type sippRun struct {
	t    *testing.T
	cmd  *exec.Cmd
	stf  string
	err  string
	done chan struct{}
	out  []byte
	werr error
}

// startSIPpUAC starts SIPp with scenario file scen against the balancer
// at lb (calls at rate per second, extra arguments after); it is stopped
// (by its own PID) when the test ends, and Wait waits for it.
func startSIPpUAC(t *testing.T, sipp, dir, lb, scen, name string, calls, rate int, extra ...string) *sippRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	r := &sippRun{t: t, stf: filepath.Join(dir, name+".csv"), err: filepath.Join(dir, name+".err"), done: make(chan struct{})}
	args := append([]string{lb, "-sf", scen, "-i", "127.0.0.1", "-p", strconv.Itoa(freeUDPPort(t)),
		"-r", strconv.Itoa(rate), "-m", strconv.Itoa(calls), "-nostdin", "-timeout", "40s", "-recv_timeout", "10000",
		"-trace_stat", "-stf", r.stf, "-trace_err", "-error_file", r.err}, extra...)
	r.cmd = exec.CommandContext(ctx, sipp, args...)
	r.cmd.Dir = dir
	var out bytes.Buffer // written by exec's copier until Wait returns
	r.cmd.Stdout, r.cmd.Stderr = &out, &out
	if err := r.cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	go func() {
		r.werr = r.cmd.Wait()
		r.out = out.Bytes()
		cancel()
		close(r.done)
	}()
	t.Cleanup(func() {
		r.cmd.Process.Kill()
		<-r.done
	})
	return r
}

// wait waits for the run to end and checks that every call succeeded.
func (r *sippRun) wait(calls int) {
	r.t.Helper()
	<-r.done
	csv, err := os.ReadFile(r.stf)
	if err != nil {
		r.t.Fatalf("sipp (%v) wrote no statistics: %v\n%s", r.werr, err, tail(r.out, 2000))
	}
	ok, failed := statColumn(r.t, csv, "SuccessfulCall(C)"), statColumn(r.t, csv, "FailedCall(C)")
	if r.werr != nil || ok != calls || failed != 0 {
		errs, _ := os.ReadFile(r.err)
		r.t.Fatalf("sipp: exit %v, %d of %d calls successful, %d failed\n%s", r.werr, ok, calls, failed, tail(errs, 2000))
	}
}

// TestSIPpPoolsAndRoutes: real SIPp answerers in three pools behind
// routes. INVITEs to sip:+4420...@voice.example reach pool london only,
// other numbers the pool default, REGISTERs the registrar pool; calls
// under way when the routes change stay on their backend (their BYE is
// answered by the answerer that took the INVITE, or SIPp fails the call),
// and new calls follow the new routes.
func TestSIPpPoolsAndRoutes(t *testing.T) {
	if testing.Short() {
		t.Skip("interop test with sipp")
	}
	sipp := needSIPp(t)
	dir := t.TempDir()
	scen, err := filepath.Abs("testdata/sipp")
	if err != nil {
		t.Fatal(err)
	}
	ports := map[string]int{}
	for _, name := range []string{"l1", "l2", "d1", "r1"} {
		p := freeUDPPort(t)
		for _, q := range ports {
			for p == q {
				p = freeUDPPort(t)
			}
		}
		ports[name] = p
		sc := "uas_rr.xml"
		if name == "r1" {
			sc = "uas_registrar.xml"
		}
		startSIPpUAS(t, sipp, dir, p, "-sf", filepath.Join(scen, sc))
	}
	addr := func(name string) string { return "127.0.0.1:" + strconv.Itoa(ports[name]) }
	backends := []string{
		addr("l1") + ",id=l1,pool=london", addr("l2") + ",id=l2,pool=london",
		addr("d1") + ",id=d1", addr("r1") + ",id=r1,pool=registrar",
	}
	routes := []string{"pool=london,domain=voice.example,user=+4420", "pool=registrar,method=REGISTER"}
	s := poolServer(t, backends, routes, nil, func(c *Config) { c.FailoverTimeout = 2 * time.Second })
	lb := s.udpAddr().String()
	sent := func(pool, id string) uint64 {
		if c := s.pool.Load().sent[poolBackend{pool, id}]; c != nil {
			return c.Load()
		}
		return 0
	}
	counts := func() [4]uint64 {
		return [4]uint64{sent("london", "l1"), sent("london", "l2"), sent("default", "d1"), sent("registrar", "r1")}
	}

	startSIPpUAC(t, sipp, dir, lb, filepath.Join(scen, "uac_domain.xml"), "london", 20, 40, "-s", "+442079460000").wait(20)
	if c := counts(); c[0]+c[1] != 20 || c[0] == 0 || c[1] == 0 || c[2] != 0 || c[3] != 0 {
		t.Fatalf("after 20 calls to +4420 (l1, l2, d1, r1): %v; want 20 over l1 and l2 only", c)
	}
	startSIPpUAC(t, sipp, dir, lb, filepath.Join(scen, "uac_domain.xml"), "default", 10, 40, "-s", "+331234").wait(10)
	if c := counts(); c[0]+c[1] != 20 || c[2] != 10 || c[3] != 0 {
		t.Fatalf("after 10 calls to +33 (l1, l2, d1, r1): %v; want 10 more at d1 only", c)
	}
	startSIPpUAC(t, sipp, dir, lb, filepath.Join(scen, "uac_register.xml"), "register", 10, 40).wait(10)
	if c := counts(); c[0]+c[1] != 20 || c[2] != 10 || c[3] != 10 {
		t.Fatalf("after 10 REGISTERs (l1, l2, d1, r1): %v; want 10 more at r1 only", c)
	}
	if n := s.metrics.NoRoute.Load(); n != 0 {
		t.Errorf("no_route = %d, want 0", n)
	}

	// Calls of 3 s to +4420; once the first are up, the london route goes:
	// those calls end on london, the later ones go to the pool default.
	before := counts()
	run := startSIPpUAC(t, sipp, dir, lb, filepath.Join(scen, "uac_domain.xml"), "change", 10, 5, "-s", "+442079460000", "-d", "3000")
	eventually(t, "two calls up on london", func() bool { c := counts(); return c[0]+c[1]-before[0]-before[1] >= 2 })
	setGen(t, s, backends, []string{"pool=registrar,method=REGISTER"})
	run.wait(10)
	after := counts()
	onLondon, onDefault := after[0]+after[1]-before[0]-before[1], after[2]-before[2]
	if onLondon < 2 || onDefault < 1 || onLondon+onDefault != 10 {
		t.Errorf("across the route change: %d calls on london, %d on default; want the first on london, the rest on default, 10 in all", onLondon, onDefault)
	}
	t.Logf("across the route change: %d calls on london (their BYEs answered there), %d on default", onLondon, onDefault)
}
