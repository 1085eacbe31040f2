package cluster

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicelb/sluice/admission"
)

// The end-to-end tests run a real redis-server on a loopback port and three
// sluice nodes as separate processes (this test binary re-executed in node
// mode, see TestMain), so a node can be killed with SIGKILL. Each node
// drives its own decisions at a given demand and prints, for every shared
// sub-interval (Redis TIME, here the same wall clock) and every local one
// (the node's monotonic clock, which its meter uses), how many it admitted.

const (
	e2eLimit = 300
	subUS    = int64(time.Second / 6 / time.Microsecond)
)

func TestMain(m *testing.M) {
	if os.Getenv("SLUICE_CLUSTER_E2E_NODE") != "" {
		os.Exit(runE2ENode())
	}
	os.Exit(m.Run())
}

// runE2ENode is one node: a Controller with a 300/s reject rule on the
// cluster, new work at SLUICE_DEMAND per second and affinity at 20/s, until
// killed or SLUICE_SECONDS pass.
func runE2ENode() int {
	demand, _ := strconv.ParseFloat(os.Getenv("SLUICE_DEMAND"), 64)
	secs, _ := strconv.Atoi(os.Getenv("SLUICE_SECONDS"))
	clock := admission.MonoClock{}
	ctl, err := admission.NewController(admission.ControllerConfig{Rules: []admission.RuleConfig{
		{Name: "invites", Limit: e2eLimit, Unit: time.Second, Action: admission.ActionReject},
	}}, nil, clock.Now())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cfg := Config{Redis: os.Getenv("SLUICE_REDIS"), Name: "e2e", Node: os.Getenv("SLUICE_CLUSTER_E2E_NODE")}
	rdb, err := NewClient(cfg.Redis, 100*time.Millisecond)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	c, err := New(cfg, rdb, clock, nil, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	c.AttachRules(ctl.Rules())
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs)*time.Second)
	defer cancel()
	go ctl.Run(ctx, clock, 5*time.Millisecond)
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	out := bufio.NewWriter(os.Stdout)
	newReq := &admission.Request{Proto: "sip", Method: "INVITE", Class: admission.NewWork}
	affReq := &admission.Request{Proto: "sip", Method: "BYE", Class: admission.Affinity}
	var acc, accAff float64
	var kR, kL, admR, arrR, admL, affOK, aff int64
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	last := time.Now()
	for ctx.Err() == nil {
		<-tick.C
		t := time.Now()
		acc += demand * t.Sub(last).Seconds()
		accAff += 20 * t.Sub(last).Seconds()
		last = t
		for ; acc >= 1; acc-- {
			now := clock.Now()
			kr, kl := t.UnixMicro()/subUS, now/int64(time.Second/6)
			if kr != kR {
				if kR != 0 {
					fmt.Fprintf(out, "R %d %d %d %d %d %s %d\n", kR, admR, arrR, affOK, aff, c.Status().Rules[0].Mode, c.Nodes())
				}
				kR, admR, arrR = kr, 0, 0
			}
			if kl != kL {
				if kL != 0 {
					fmt.Fprintf(out, "L %d %d\n", kL, admL)
				}
				kL, admL = kl, 0
			}
			arrR++
			if ctl.Decide(now, newReq, nil).Verdict == admission.Admit {
				admR++
				admL++
			}
		}
		for ; accAff >= 1; accAff-- {
			aff++
			if ctl.Decide(clock.Now(), affReq, nil).Verdict == admission.Admit {
				affOK++
			}
		}
		out.Flush()
	}
	cancel()
	<-done
	return 0
}

// e2eRun collects what the nodes printed.
type e2eRun struct {
	mu     sync.Mutex
	shared map[int64][]int64 // shared sub-interval → admitted per node
	local  []map[int64]int64 // per node: local sub-interval → admitted
	mode   []map[int64]string
	aff    []int64 // per node: affinity decisions and admitted (last report)
	affOK  []int64
	procs  []*exec.Cmd
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startRedis starts redis-server on 127.0.0.1:port and waits until it
// answers; the cleanup stops it by PID.
func startRedis(t *testing.T, port int) *exec.Cmd {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not installed (scripts/install-test-deps.sh installs it)")
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopProc(cmd) })
	rdb := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port)})
	defer rdb.Close()
	for i := 0; i < 100; i++ {
		if rdb.Ping(context.Background()).Err() == nil {
			return cmd
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("redis-server on port %d did not answer within 2s", port)
	return nil
}

func stopProc(cmd *exec.Cmd) {
	if cmd.ProcessState == nil {
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
	}
}

// startNodes starts one node process per demand, each running secs seconds.
func startNodes(t *testing.T, url string, demand []float64, secs int) *e2eRun {
	t.Helper()
	run := &e2eRun{shared: map[int64][]int64{}}
	for i, d := range demand {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "SLUICE_CLUSTER_E2E_NODE=node"+strconv.Itoa(i), "SLUICE_REDIS="+url,
			fmt.Sprintf("SLUICE_DEMAND=%g", d), fmt.Sprintf("SLUICE_SECONDS=%d", secs))
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stopProc(cmd) })
		run.procs = append(run.procs, cmd)
		run.local = append(run.local, map[int64]int64{})
		run.mode = append(run.mode, map[int64]string{})
		run.aff = append(run.aff, 0)
		run.affOK = append(run.affOK, 0)
		go run.read(i, len(demand), out)
	}
	return run
}

func (r *e2eRun) read(i, n int, out interface{ Read([]byte) (int, error) }) {
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		num := func(j int) int64 { v, _ := strconv.ParseInt(f[j], 10, 64); return v }
		r.mu.Lock()
		switch {
		case f[0] == "R" && len(f) == 8:
			k := num(1)
			if r.shared[k] == nil {
				r.shared[k] = make([]int64, n)
			}
			r.shared[k][i] = num(2)
			r.affOK[i], r.aff[i] = num(4), num(5)
			r.mode[i][k] = f[6]
		case f[0] == "L" && len(f) == 3:
			r.local[i][num(1)] = num(2)
		}
		r.mu.Unlock()
	}
}

// window sums shared sub-intervals [from, to) for the given nodes.
func (r *e2eRun) window(from, to int64, nodes ...int) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var s int64
	for k := from; k < to; k++ {
		for _, i := range nodes {
			if v := r.shared[k]; v != nil {
				s += v[i]
			}
		}
	}
	return s
}

// worstShared is the most admitted by nodes in six consecutive shared
// sub-intervals starting in [from, to).
func (r *e2eRun) worstShared(from, to int64, nodes ...int) int64 {
	var w int64
	for k := from; k < to; k++ {
		w = max(w, r.window(k, k+6, nodes...))
	}
	return w
}

// worstLocal is node i's most admitted in six consecutive local
// sub-intervals starting in [from, to) (its meter's own alignment).
func (r *e2eRun) worstLocal(i int, from, to int64) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var w int64
	for k := from; k < to; k++ {
		var s int64
		for j := k; j < k+6; j++ {
			s += r.local[i][j]
		}
		w = max(w, s)
	}
	return w
}

func kNow() int64 { return time.Now().UnixMicro() / subUS }

func nodes(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// TestE2ELimitHolds: 300/s across three nodes holds within 2 % with demand
// spread evenly and unevenly (80/10/10), and no window of six shared
// sub-intervals admits more than 300.
func TestE2ELimitHolds(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end with redis-server")
	}
	port := freePort(t)
	startRedis(t, port)
	url := fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	for _, tc := range []struct {
		name   string
		demand []float64
	}{
		{"even", []float64{150, 150, 150}},
		{"uneven", []float64{360, 45, 45}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := startNodes(t, url, tc.demand, 6)
			time.Sleep(1500 * time.Millisecond)
			k0 := kNow()
			time.Sleep(4 * time.Second)
			k1 := kNow() - 1 // the last sub-interval may not be reported yet
			n := (k1 - k0) / 6 * 6
			got := run.window(k0, k0+n, nodes(3)...)
			rate := float64(got) / (float64(n) / 6)
			worst := run.worstShared(k0, k0+n-5, nodes(3)...)
			t.Logf("%s: %.1f admitted/s over %d sub-intervals (limit %d), worst window %d", tc.name, rate, n, e2eLimit, worst)
			if rate < 0.98*e2eLimit || rate > 1.02*e2eLimit {
				t.Errorf("cluster rate %.1f/s, want %d ± 2%%", rate, e2eLimit)
			}
			if worst > e2eLimit {
				t.Errorf("a window of six sub-intervals admitted %d, over %d", worst, e2eLimit)
			}
			for _, p := range run.procs {
				stopProc(p)
			}
		})
	}
}
