package cluster

import (
	"bufio"
	"context"
	"fmt"
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
	"github.com/sluicelb/sluice/internal/testenv"
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
	rdb, err := NewClient(cfg.Redis, DefaultConfig().Timeout)
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
	var kR, kL, admR, ambR, arrR, admL, affOK, aff int64
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	last := time.Now()
	wallOffset := time.Now().UnixMicro() - clock.Now()/1000 // wall µs = monotonic µs + offset
	for ctx.Err() == nil {
		<-tick.C
		t := time.Now()
		acc += demand * t.Sub(last).Seconds()
		accAff += 20 * t.Sub(last).Seconds()
		last = t
		for ; acc >= 1; acc-- {
			now := clock.Now()
			admitted := ctl.Decide(now, newReq, nil).Verdict == admission.Admit
			after := clock.Now()
			// The shared sub-interval of the decision: the one its
			// monotonic reading falls in (a wall reading taken before or
			// after could fall on the other side of a boundary). A decision
			// that waited for a lease round trip (Config.Wait) was made at
			// the clock's reading after the wait, somewhere in [now, after];
			// when that span crosses a boundary:
			//   - a reading within expiryMargin of its sub-interval's end
			//     cannot have spent that sub-interval's tokens (they stop
			//     being spendable there), so an admission was the next's;
			//   - otherwise it is unknown (a wait or a preemption of more
			//     than the margin): counted in the rate, not in the windows.
			kr, ka := sharedK(now, wallOffset), sharedK(after, wallOffset)
			ambiguous := false
			if ka != kr {
				if kr*subUS+subUS-(now/1000+wallOffset) <= int64(expiryMargin/time.Microsecond) {
					kr = ka
				} else {
					ambiguous = true
				}
			}
			kl := now / int64(time.Second/6)
			if kr != kR {
				if kR != 0 {
					fmt.Fprintf(out, "R %d %d %d %d %d %s %d %d\n", kR, admR, arrR, affOK, aff, c.Status().Rules[0].Mode, c.Nodes(), ambR)
				}
				kR, admR, ambR, arrR = kr, 0, 0, 0
			}
			if kl != kL {
				if kL != 0 {
					fmt.Fprintf(out, "L %d %d %s\n", kL, admL, c.Status().Rules[0].Mode)
				}
				kL, admL = kl, 0
			}
			arrR++
			switch {
			case admitted && ambiguous:
				ambR++ // this sub-interval or the next: the rate's, not a window's
				admL++
			case admitted:
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
	amb    map[int64][]int64 // shared sub-interval → admitted per node, unsure whether in it or the next
	local  []map[int64]int64 // per node: local sub-interval → admitted
	lmode  []map[int64]string
	mode   []map[int64]string
	nodes  []map[int64]int64 // per node: shared sub-interval → node count it saw
	aff    []int64           // per node: affinity decisions and admitted (last report)
	affOK  []int64
	procs  []*exec.Cmd
}

// freePort is a port for a server the test starts: below the ephemeral
// range, see testenv.FreePort.
func freePort(t testing.TB) int { return testenv.FreePortNum(t) }

// startRedis starts redis-server on 127.0.0.1:port and waits until it
// answers; the cleanup stops it by PID.
func startRedis(t testing.TB, port int) *exec.Cmd {
	t.Helper()
	bin := testenv.Tool(t, "redis-server", "redis-server")
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
	run := &e2eRun{shared: map[int64][]int64{}, amb: map[int64][]int64{}}
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
		run.mu.Lock() // the readers of earlier nodes run already
		run.procs = append(run.procs, cmd)
		run.local = append(run.local, map[int64]int64{})
		run.mode = append(run.mode, map[int64]string{})
		run.lmode = append(run.lmode, map[int64]string{})
		run.nodes = append(run.nodes, map[int64]int64{})
		run.aff = append(run.aff, 0)
		run.affOK = append(run.affOK, 0)
		run.mu.Unlock()
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
		case f[0] == "R" && len(f) == 9:
			k := num(1)
			if r.shared[k] == nil {
				r.shared[k], r.amb[k] = make([]int64, n), make([]int64, n)
			}
			r.shared[k][i], r.amb[k][i] = num(2), num(8)
			r.affOK[i], r.aff[i] = num(4), num(5)
			r.mode[i][k] = f[6]
			r.nodes[i][k] = num(7)
		case f[0] == "L" && len(f) == 4:
			r.local[i][num(1)] = num(2)
			r.lmode[i][num(1)] = f[3]
		}
		r.mu.Unlock()
	}
}

// window sums what the given nodes admitted in shared sub-intervals
// [from, to), by the sub-interval each admission was surely made in.
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

// admitted is window with the admissions of unsure sub-interval (made
// across a boundary, see runE2ENode) counted too: for rates.
func (r *e2eRun) admitted(from, to int64, nodes ...int) int64 {
	s := r.window(from, to, nodes...)
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := from; k < to; k++ {
		for _, i := range nodes {
			if v := r.amb[k]; v != nil {
				s += v[i]
			}
		}
	}
	return s
}

// allShared reports whether none of the given nodes reported a mode other
// than shared in sub-intervals [from, to) (a node that reported nothing,
// killed, does not count).
func (r *e2eRun) allShared(from, to int64, nodes ...int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := from; k < to; k++ {
		for _, i := range nodes {
			if md, ok := r.mode[i][k]; ok && md != "shared" {
				return false
			}
		}
	}
	return true
}

// worstShared is the most admitted by nodes in six consecutive shared
// sub-intervals starting in [from, to), of the windows in which every
// node was in shared mode: the limit is promised cluster-wide only then. A
// node on its fail policy (a round trip missed its deadline twice) admits
// its local share without counting it in Redis while the others spend the
// shared budget, so such a window may hold up to limit + limit ÷ nodes.
func (r *e2eRun) worstShared(t *testing.T, from, to int64, nodes ...int) int64 {
	w, _ := r.worstSharedAt(t, from, to, nodes...)
	return w
}

// worstSharedAt is worstShared and the first sub-interval of that window.
// It fails the test when fewer than half the windows could be checked.
func (r *e2eRun) worstSharedAt(t *testing.T, from, to int64, nodes ...int) (worst, at int64) {
	t.Helper()
	checked := 0
	for k := from; k < to; k++ {
		if !r.allShared(k, k+6, nodes...) {
			continue
		}
		checked++
		if s := r.window(k, k+6, nodes...); s > worst {
			worst, at = s, k
		}
	}
	if 2*checked < int(to-from) {
		t.Errorf("only %d of %d windows had every node in shared mode: %s", checked, to-from, r.dump(from, to+5))
	}
	return worst, at
}

// dump describes shared sub-intervals [from, to): per node what it
// admitted, its mode and the node count it saw, for a failure message.
func (r *e2eRun) dump(from, to int64) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for k := from; k < to; k++ {
		fmt.Fprintf(&b, "\n  k=%d:", k)
		for i := range r.mode {
			var adm int64
			if v := r.shared[k]; v != nil {
				adm = v[i]
			}
			fmt.Fprintf(&b, " node%d %d %s n=%d;", i, adm, r.mode[i][k], r.nodes[i][k])
		}
	}
	return b.String()
}

// worstLocal is node i's most admitted in six consecutive local
// sub-intervals (its meter's own alignment) that were all in mode, and how
// many such windows there were.
func (r *e2eRun) worstLocal(i int, mode string) (worst int64, windows int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range r.local[i] {
		var s int64
		ok := true
		for j := k; j < k+6 && ok; j++ {
			ok = r.lmode[i][j] == mode
			s += r.local[i][j]
		}
		if ok {
			worst = max(worst, s)
			windows++
		}
	}
	return worst, windows
}

// modes returns the modes node i reported for shared sub-intervals [from, to).
func (r *e2eRun) modes(i int, from, to int64) map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := map[string]int{}
	for k := from; k < to; k++ {
		if md, ok := r.mode[i][k]; ok {
			m[md]++
		}
	}
	return m
}

// requireShared fails the test if a node left shared mode in [from, to)
// for more than one sub-interval in ten: the limit is only promised
// cluster-wide while Redis answers in time. One round trip in ten that
// misses its deadline on a machine running other packages' tests under
// the race detector beside three nodes and Redis (seen: 1 of 18) leaves
// that node on its local share (limit ÷ nodes) for a sub-interval; the
// windows around it are left out of the limit checks (worstShared), and
// the rest must still hold. More than that, or any other mode, is a
// failure.
func (r *e2eRun) requireShared(t *testing.T, from, to int64, nodes ...int) {
	t.Helper()
	if nodes == nil {
		nodes = []int{0, 1, 2}
	}
	for _, i := range nodes {
		m := r.modes(i, from, to)
		total := 0
		for _, n := range m {
			total += n
		}
		if m["shared"] == 0 || m["shared"]+m["local"] != total || m["local"] > max(1, total/10) {
			t.Errorf("node %d was in modes %v while Redis was up: its round trips failed (machine overloaded?)", i, m)
		}
	}
}

func kNow() int64 { return time.Now().UnixMicro() / subUS }

// sharedK is the shared sub-interval of monotonic reading mono (ns), given
// wall µs = monotonic µs + wallOffset.
func sharedK(mono, wallOffset int64) int64 { return (mono/1000 + wallOffset) / subUS }

func nodes(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// TestE2ELimitHolds: 300/s across three nodes holds with demand spread
// evenly and unevenly (80/10/10): no window of six shared sub-intervals
// admits more than 300 (the lease's guarantee, exact), and the rate is
// within 10 % of the limit (a coarse bound: three processes under the race
// detector beside other packages; the exact figures are the fake-time
// simulation's, sim_test.go, and bench/cluster.sh measures them).
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
			run := startNodes(t, url, tc.demand, 9) // outlives the measurement; stopped below
			time.Sleep(1500 * time.Millisecond)
			k0 := kNow()
			time.Sleep(4 * time.Second)
			k1 := kNow() - 1 // the last sub-interval may not be reported yet
			n := (k1 - k0) / 6 * 6
			got := run.admitted(k0, k0+n, nodes(3)...)
			rate := float64(got) / (float64(n) / 6)
			worst, at := run.worstSharedAt(t, k0, k0+n-5, nodes(3)...)
			t.Logf("%s: %.1f admitted/s over %d sub-intervals (limit %d), worst window %d", tc.name, rate, n, e2eLimit, worst)
			run.requireShared(t, k0, k0+n)
			if rate < 0.9*e2eLimit || rate > 1.1*e2eLimit {
				t.Errorf("cluster rate %.1f/s, want %d ± 10%%", rate, e2eLimit)
			}
			if worst > e2eLimit {
				t.Errorf("a window of six sub-intervals admitted %d, over %d:%s", worst, e2eLimit, run.dump(at-1, at+7))
			}
			for _, p := range run.procs {
				stopProc(p)
			}
		})
	}
}

// TestE2ERedisAway: Redis killed mid-run: every node falls back to limit ÷ 3
// on its own and affinity stays admitted; Redis restarted: the nodes rejoin
// and share the budget again without a restart.
func TestE2ERedisAway(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end with redis-server")
	}
	port := freePort(t)
	srv := startRedis(t, port)
	url := fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	run := startNodes(t, url, []float64{150, 150, 150}, 15)
	time.Sleep(2 * time.Second)
	stopProc(srv)
	kDown := kNow()
	time.Sleep(4 * time.Second)
	kUp := kNow()
	startRedis(t, port)
	// go-redis redials a pool whose dials kept failing once a second, so
	// the nodes rejoin within about a second; then the first window still
	// holds what they admitted alone (counted again on rejoin).
	var kShared int64
	for i := 0; i < 50 && kShared == 0; i++ {
		time.Sleep(100 * time.Millisecond)
		k := kNow() - 1
		if m := [3]map[string]int{run.modes(0, k, k+1), run.modes(1, k, k+1), run.modes(2, k, k+1)}; m[0]["shared"]+m[1]["shared"]+m[2]["shared"] == 3 {
			kShared = k
		}
	}
	if kShared == 0 {
		t.Fatal("the nodes did not rejoin within 5s of Redis's restart")
	}
	t.Logf("rejoined %.2fs after the restart", float64(kShared-kUp)/6)
	time.Sleep(1200 * time.Millisecond)
	k0 := kNow()
	time.Sleep(3 * time.Second)
	k1 := kNow() - 1
	for i := range 3 {
		worst, windows := run.worstLocal(i, "local")
		md := run.modes(i, kDown+2, kUp)
		t.Logf("node %d while Redis was away: modes %v, worst local window %d (limit ÷ 3 = %d) over %d windows", i, md, worst, e2eLimit/3, windows)
		if windows < 6 || md["local"] == 0 || md["shared"] > 0 {
			t.Errorf("node %d: Redis away but modes %v, %d local windows", i, md, windows)
		}
		if worst > e2eLimit/3 {
			t.Errorf("node %d admitted %d in a window while Redis was away, over limit ÷ 3 = %d", i, worst, e2eLimit/3)
		}
		if m := run.modes(i, k0, k1); m["shared"] == 0 || len(m) != 1 {
			t.Errorf("node %d after Redis came back: modes %v, want shared only", i, m)
		}
		run.mu.Lock()
		ok, all := run.affOK[i], run.aff[i]
		run.mu.Unlock()
		if ok != all || all < 100 {
			t.Errorf("node %d: affinity admitted %d of %d, want all", i, ok, all)
		}
	}
	n := (k1 - k0) / 6 * 6
	rate := float64(run.admitted(k0, k0+n, nodes(3)...)) / (float64(n) / 6)
	worst := run.worstShared(t, k0, k0+n-5, nodes(3)...)
	run.requireShared(t, k0, k1)
	t.Logf("after the restart: %.1f admitted/s over %d sub-intervals, worst window %d", rate, n, worst)
	if rate < 0.85*e2eLimit || worst > e2eLimit {
		t.Errorf("after the restart: %.1f/s and worst window %d, want about %d and at most %d", rate, worst, e2eLimit, e2eLimit)
	}
}

// TestE2ENodeKilled: one of three nodes is killed with SIGKILL: within a
// second the others count two nodes and take (nearly) the whole limit, and
// no window admits more than it. Coarse bounds for processes under the race
// detector; the exact instants are the fake-time simulation's
// (sim_test.go) and bench/cluster.sh measures them.
func TestE2ENodeKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end with redis-server")
	}
	port := freePort(t)
	startRedis(t, port)
	url := fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	run := startNodes(t, url, []float64{200, 200, 200}, 9)
	time.Sleep(2500 * time.Millisecond)
	run.procs[2].Process.Signal(syscall.SIGKILL)
	kKill := kNow()
	time.Sleep(3800 * time.Millisecond)
	// The dead node's admissions (and its last lease, counted but unspent)
	// stay in the window until six sub-intervals after the kill; from then
	// on the survivors alone must fill it.
	rateFirst := float64(run.admitted(kKill+1, kKill+7, 0, 1))
	from, to := kKill+7, kKill+19
	rate := float64(run.admitted(from, to, 0, 1)) / 2
	worst := run.worstShared(t, kKill-5, to-5, 0, 1, 2)
	run.mu.Lock()
	var seen []int64
	counted := int64(0) // the first sub-interval both survivors count 2 nodes
	for k := kKill + 1; k <= kKill+6; k++ {
		seen = append(seen, run.nodes[0][k], run.nodes[1][k])
		if counted == 0 && run.nodes[0][k] == 2 && run.nodes[1][k] == 2 {
			counted = k - kKill
		}
	}
	run.mu.Unlock()
	run.requireShared(t, kKill-6, to, 0, 1)
	t.Logf("after the kill: survivors admitted %.0f in the first window, then %.1f/s over 12 sub-intervals; worst window %d; node counts seen at +1 to +6 sub-intervals %v (both count 2 from +%d)", rateFirst, rate, worst, seen, counted)
	if rate < 0.9*e2eLimit {
		t.Errorf("survivors admitted %.1f/s, want at least 90%% of %d", rate, e2eLimit)
	}
	if worst > e2eLimit {
		t.Errorf("a window admitted %d, over %d", worst, e2eLimit)
	}
	if counted == 0 {
		t.Errorf("node counts in the second after the kill %v, want both survivors at 2", seen)
	}
}
