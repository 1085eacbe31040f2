package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/demo"
	"github.com/sluicelb/sluice/demo/sipdemo"
)

// config is one overload scenario.
type config struct {
	Sluice string // path of the sluice binary

	Sessions int // sticky HTTP sessions kept alive throughout
	Dialogs  int // SIP dialogs kept alive throughout

	Duration time.Duration // the overload phase
	Factor   float64       // new work offered, times the learned rate

	Lifetime     time.Duration // an HTTP session's memory lifetime in its backend; a new call's length
	SessionBytes int           // memory a session or dialog holds in its backend
	BackendMax   int64         // each backend's maximum memory
	MaxHeap      float64       // -mop-max-heap
	Window       time.Duration // -mop-window
	Probe        time.Duration // -mop-probe-interval
	InitialRate  float64       // -mop-initial-rate

	Interval       time.Duration // a sticky session's request period
	DialogInterval time.Duration // a dialog's re-INVITE period

	SetupTimeout time.Duration // bound on establishing the sessions and dialogs
	LearnTimeout time.Duration // bound on the learning phase
	LearnFactor  float64       // new work offered while learning, times the model's safe rate

	Concurrency int // new-work requests in flight at most, per protocol

	// Growth bounds of the balancer between the start and the end of the
	// overload phase: end < 2 × start + slack.
	GoroutineSlack int
	RSSSlack       int64

	Out io.Writer // the live table; nil discards
	Dir string    // work directory (sluice's data and log)
}

// phase names.
const (
	phaseSetup  = "setup"  // sticky sessions and dialogs established (new work)
	phaseSettle = "settle" // they alone, for one MOP window
	phaseLearn  = "learn"  // new work above the safe rate until MOP has learned, and one window more
	phaseLoad   = "load"   // new work at Factor × the learned rate
	phaseEnd    = "end"    // new work stopped, sessions and dialogs ended
)

// row is one second of the run.
type row struct {
	At    time.Duration
	Phase string
	Mem   []float64 // used/max of each backend (h1 h2 s1 s2), from the backends themselves

	HTTPSent, HTTPAdmitted, HTTPRefused uint64 // new work this second
	SIPSent, SIPAdmitted, SIPRefused    uint64
	AffSent, AffOK                      uint64 // affinity this second, HTTP and SIP
	NoRetryAfter                        uint64 // running total

	HTTPAllowed, SIPAllowed float64 // MOP allowed rates, summed per protocol
	Learned                 int     // backends whose MOP phase is learned
	RSS                     int64   // balancer resident memory, bytes
	Goroutines              int     // balancer goroutines
}

// report is the outcome of a run.
type report struct {
	Cfg     config
	Names   []string
	Rows    []row
	Learned bool    // every backend's MOP reached learned in the learning phase
	HTTPCap float64 // learned rate, HTTP backends summed
	SIPCap  float64
	HTTPOff float64 // offered in the overload phase, per second
	SIPOff  float64

	AffHTTPSent, AffHTTPOK uint64
	AffSIPSent, AffSIPOK   uint64
	HTTPSent, HTTPAdmitted uint64 // new work in the overload phase
	HTTPRefused            uint64
	SIPSent, SIPAdmitted   uint64
	SIPRefused             uint64
	NoRetryAfter, NewLost  uint64 // whole run
	Skipped                uint64
	Retransmits, Stray     uint64

	Failures, NoRA, Lost []string
	Refusals             map[string]int

	MaxMem        []float64            // per backend, overload phase
	PhaseMem      map[string][]float64 // per phase, per backend
	Phases        []string             // in order
	LoadStartRSS  int64
	LoadEndRSS    int64
	PeakRSS       int64
	LoadStartGor  int
	LoadEndGor    int
	PeakGor       int
	SluiceStopped bool
}

// modelRate is the demo backends' safe rate of new work per backend: the
// room under the ceiling left by the sessions or dialogs kept alive, over
// the memory one new session holds for its lifetime.
func (c config) modelRate(kept int) float64 {
	room := c.MaxHeap*float64(c.BackendMax) - float64(kept/2*c.SessionBytes)
	return max(1, room/float64(c.SessionBytes)/c.Lifetime.Seconds())
}

// sluiceProc is the balancer under test, a child process.
type sluiceProc struct {
	cmd   *exec.Cmd
	admin string // http://127.0.0.1:PORT
	http  string
	sip   string
	done  chan struct{}
	err   error
}

// run runs the scenario: balancer and backends up, sessions and dialogs
// established, MOP learned, then new work at Factor × the learned rate for
// Duration while the sessions and dialogs keep sending. It returns what it
// measured; an error means the scenario could not be carried out.
func run(ctx context.Context, cfg config) (*report, error) {
	var out io.Writer = io.Discard
	if cfg.Out != nil {
		// The sampler's rows and the phases' lines come from different
		// goroutines.
		out = &lockedWriter{w: cfg.Out}
	}
	logger := slog.New(slog.DiscardHandler)
	sip.SetDefaultLogger(logger)

	// Backends: dialogs set up here must outlive the whole run, so the
	// dialog timeout is the run's bound; new calls end with their BYE.
	bound := cfg.SetupTimeout + cfg.LearnTimeout + cfg.Duration + time.Minute
	var hb []*demo.HTTPBackend
	var sb []*sipdemo.UAS
	defer func() {
		for _, b := range hb {
			b.Close()
		}
		for _, u := range sb {
			u.Close()
		}
	}()
	args := []string{"run"}
	for i := 1; i <= 2; i++ {
		b, err := demo.NewHTTPBackend(demo.HTTPBackendConfig{Name: fmt.Sprintf("h%d", i), SessionBytes: cfg.SessionBytes,
			SessionLifetime: cfg.Lifetime, MaxMemory: cfg.BackendMax, Logger: logger})
		if err != nil {
			return nil, err
		}
		hb = append(hb, b)
		args = append(args, "-http-backend", fmt.Sprintf("%s,metrics=%s,id=%s", b.Addr(), b.MetricsURL(), b.Name()))
	}
	for i := 1; i <= 2; i++ {
		u, err := sipdemo.New(sipdemo.Config{Name: fmt.Sprintf("s%d", i), DialogBytes: cfg.SessionBytes,
			DialogTimeout: bound, MaxMemory: cfg.BackendMax, Logger: logger})
		if err != nil {
			return nil, err
		}
		sb = append(sb, u)
		args = append(args, "-sip-backend", fmt.Sprintf("%s,metrics=%s,id=%s", u.Addr(), u.MetricsURL(), u.Name()))
	}
	ledgers := []*demo.Ledger{hb[0].Ledger(), hb[1].Ledger(), sb[0].Ledger(), sb[1].Ledger()}
	rep := &report{Cfg: cfg, Names: []string{"h1", "h2", "s1", "s2"}, MaxMem: make([]float64, 4), PhaseMem: map[string][]float64{}}

	sl, err := startSluice(ctx, cfg, args)
	if err != nil {
		return nil, err
	}
	defer func() { rep.SluiceStopped = sl.stop(15 * time.Second) }()
	if err := sl.waitUp(ctx, 4, 20*time.Second); err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "sluice pid %d: http %s, sip %s, admin %s\n", sl.cmd.Process.Pid, sl.http, sl.sip, sl.admin)

	c := &counters{}
	hl := newHTTPLoad(sl.http, c, cfg.Sessions+cfg.Concurrency+16)
	defer hl.close()
	u, err := newUAC(sl.sip, 4)
	if err != nil {
		return nil, err
	}
	defer u.close()
	sipl := &sipLoad{u: u, c: c, limit: 8 * time.Second}

	// The sampler writes a row each second, with the phase set below.
	start := time.Now()
	var phaseMu sync.Mutex
	phase := phaseSetup
	setPhase := func(p string) { phaseMu.Lock(); phase = p; phaseMu.Unlock() }
	sampleCtx, stopSampling := context.WithCancel(context.Background())
	sampled := make(chan struct{})
	var lastStatus statusDoc
	var statusMu sync.Mutex
	go func() {
		defer close(sampled)
		fmt.Fprintln(out, tableHeader)
		var prev snapshot
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-sampleCtx.Done():
				return
			case <-tick.C:
			}
			phaseMu.Lock()
			p := phase
			phaseMu.Unlock()
			r, snap, st := sample(sl, ledgers, c, prev, time.Since(start), p)
			prev = snap
			statusMu.Lock()
			lastStatus = st
			rep.Rows = append(rep.Rows, r)
			statusMu.Unlock()
			fmt.Fprintln(out, r.format())
		}
	}()
	status := func() statusDoc {
		statusMu.Lock()
		defer statusMu.Unlock()
		return lastStatus
	}

	// Setup: sessions and dialogs, each established as new work, then kept.
	affCtx, stopAffinity := context.WithCancel(context.Background())
	var kept sync.WaitGroup
	setupCtx, cancelSetup := context.WithTimeout(ctx, cfg.SetupTimeout)
	var setupWG sync.WaitGroup
	var setupErrs sync.Map
	sem := make(chan struct{}, 32)
	for i := range cfg.Sessions {
		setupWG.Add(1)
		go func() {
			defer setupWG.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			s := &session{id: i}
			if err := hl.establish(setupCtx, s, time.Second); err != nil {
				setupErrs.Store("http", err)
				return
			}
			kept.Add(1)
			go func() { defer kept.Done(); hl.keep(affCtx, s, cfg.Interval) }()
		}()
	}
	for range cfg.Dialogs {
		setupWG.Add(1)
		go func() {
			defer setupWG.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			d, err := sipl.establishDialog(setupCtx, time.Second)
			if err != nil {
				setupErrs.Store("sip", err)
				return
			}
			kept.Add(1)
			go func() { defer kept.Done(); sipl.keepDialog(affCtx, d, cfg.DialogInterval) }()
		}()
	}
	setupWG.Wait()
	cancelSetup()
	var setupErr error
	setupErrs.Range(func(k, v any) bool {
		setupErr = errors.Join(setupErr, fmt.Errorf("%s sessions not all established within %v: %v", k, cfg.SetupTimeout, v))
		return true
	})

	finish := func() {
		setPhase(phaseEnd)
		stopAffinity()
		kept.Wait()
		sipl.holding.Wait()
		time.Sleep(1100 * time.Millisecond) // a last row with everything ended
		stopSampling()
		<-sampled
	}
	if setupErr != nil {
		finish()
		return rep, setupErr
	}

	// Settling: the sessions and dialogs alone for one window. MOP assumes
	// that a session lives at most a window; these were admitted as new
	// work and are kept alive by their affinity traffic, so until they
	// have outlived a window they look like work that is about to end.
	setPhase(phaseSettle)
	if !sleepCtx(ctx, cfg.Window) {
		finish()
		return rep, ctx.Err()
	}

	// Learning: new work above the model's safe rate until every backend's
	// MOP has learned (or the bound passes), then one window more so that
	// memory shows the learned rate before the overload starts.
	setPhase(phaseLearn)
	learnHTTP := cfg.LearnFactor * 2 * cfg.modelRate(cfg.Sessions)
	learnSIP := cfg.LearnFactor * 2 * cfg.modelRate(cfg.Dialogs)
	fmt.Fprintf(out, "learning: offering %.0f/s HTTP, %.0f/s SIP new work until MOP has learned every backend (at most %v)\n", learnHTTP, learnSIP, cfg.LearnTimeout)
	// The offer runs until the watcher below ends it: a window after MOP
	// has learned, or at the bound. A timeout of its own would end it
	// while the watcher still waits out that window, and the second or
	// two without new work would let memory drain and every bucket fill
	// before the overload starts (a burst the run does not describe).
	learnCtx, stopLearn := context.WithCancel(ctx)
	learnEnd := time.Now().Add(cfg.LearnTimeout + cfg.Window)
	var offering sync.WaitGroup
	offering.Add(3)
	go func() { defer offering.Done(); offer(learnCtx, learnHTTP, cfg.Concurrency, c, hl.newWork) }()
	go func() {
		defer offering.Done()
		offer(learnCtx, learnSIP, cfg.Concurrency, c, func(uint64) { sipl.newCall(affCtx, cfg.Lifetime) })
	}()
	go func() {
		defer offering.Done()
		defer stopLearn()
		for sleepCtx(learnCtx, 250*time.Millisecond) && time.Now().Before(learnEnd) {
			if st := status(); st.learned() == 4 {
				rep.Learned = true
				fmt.Fprintf(out, "learned: every backend; one window more at the same offer\n")
				sleepCtx(ctx, cfg.Window)
				return
			}
		}
	}()
	offering.Wait()
	if ctx.Err() != nil {
		finish()
		return rep, ctx.Err()
	}

	// Overload: Factor × the learned rate (the allowed rate where nothing
	// was learned in time).
	st, err := sl.status()
	if err != nil {
		finish()
		return rep, err
	}
	rep.HTTPCap, rep.SIPCap = st.capacity("http"), st.capacity("sip")
	rep.HTTPOff, rep.SIPOff = cfg.Factor*rep.HTTPCap, cfg.Factor*rep.SIPCap
	fmt.Fprintf(out, "overload: learned %v; capacity %.1f/s HTTP, %.1f/s SIP; offering %.0f/s and %.0f/s for %v\n",
		rep.Learned, rep.HTTPCap, rep.SIPCap, rep.HTTPOff, rep.SIPOff, cfg.Duration)
	before := c.snapshot()
	setPhase(phaseLoad)
	loadCtx, stopLoad := context.WithTimeout(ctx, cfg.Duration)
	offering.Add(2)
	go func() { defer offering.Done(); offer(loadCtx, rep.HTTPOff, cfg.Concurrency, c, hl.newWork) }()
	go func() {
		defer offering.Done()
		offer(loadCtx, rep.SIPOff, cfg.Concurrency, c, func(uint64) { sipl.newCall(affCtx, cfg.Lifetime) })
	}()
	offering.Wait()
	stopLoad()
	after := c.snapshot()
	finish()

	rep.HTTPSent, rep.HTTPAdmitted, rep.HTTPRefused = after.httpSent-before.httpSent, after.httpAdm-before.httpAdm, after.httpRef-before.httpRef
	rep.SIPSent, rep.SIPAdmitted, rep.SIPRefused = after.sipSent-before.sipSent, after.sipAdm-before.sipAdm, after.sipRef-before.sipRef
	rep.AffHTTPSent, rep.AffHTTPOK = c.affHTTPSent.Load(), c.affHTTPOK.Load()
	rep.AffSIPSent, rep.AffSIPOK = c.affSIPSent.Load(), c.affSIPOK.Load()
	rep.NoRetryAfter, rep.NewLost, rep.Skipped = c.noRetryAfter.Load(), c.newLost.Load(), c.skipped.Load()
	rep.Retransmits, rep.Stray = u.retrans.Load(), u.stray.Load()
	c.mu.Lock()
	rep.Failures, rep.NoRA, rep.Lost, rep.Refusals = c.failures, c.noRA, c.lost, c.refusals
	c.mu.Unlock()
	rep.summarize()
	return rep, nil
}

// snapshot is the counters at one moment.
type snapshot struct {
	httpSent, httpAdm, httpRef uint64
	sipSent, sipAdm, sipRef    uint64
	affSent, affOK             uint64
}

func (c *counters) snapshot() snapshot {
	return snapshot{
		httpSent: c.newHTTPSent.Load(), httpAdm: c.newHTTPAdmitted.Load(), httpRef: c.newHTTPRefused.Load(),
		sipSent: c.newSIPSent.Load(), sipAdm: c.newSIPAdmitted.Load(), sipRef: c.newSIPRefused.Load(),
		affSent: c.affHTTPSent.Load() + c.affSIPSent.Load(), affOK: c.affHTTPOK.Load() + c.affSIPOK.Load(),
	}
}

// sample takes one row: the backends' memory from their ledgers, the
// balancer's MOP view from /status, its goroutines from /metrics and its
// resident memory from /proc.
func sample(sl *sluiceProc, ledgers []*demo.Ledger, c *counters, prev snapshot, at time.Duration, phase string) (row, snapshot, statusDoc) {
	s := c.snapshot()
	r := row{At: at, Phase: phase,
		HTTPSent: s.httpSent - prev.httpSent, HTTPAdmitted: s.httpAdm - prev.httpAdm, HTTPRefused: s.httpRef - prev.httpRef,
		SIPSent: s.sipSent - prev.sipSent, SIPAdmitted: s.sipAdm - prev.sipAdm, SIPRefused: s.sipRef - prev.sipRef,
		AffSent: s.affSent - prev.affSent, AffOK: s.affOK - prev.affOK, NoRetryAfter: c.noRetryAfter.Load()}
	for _, l := range ledgers {
		r.Mem = append(r.Mem, float64(l.Used())/float64(l.Max()))
	}
	st, err := sl.status()
	if err == nil {
		r.HTTPAllowed, r.SIPAllowed = st.allowed("http"), st.allowed("sip")
		r.Learned = st.learned()
	}
	r.Goroutines = sl.goroutines()
	r.RSS = rss(sl.cmd.Process.Pid)
	return r, s, st
}

const tableHeader = "     t phase  | mem%  h1    h2    s1    s2  | HTTP new sent  adm   ref | SIP new sent  adm   ref | affinity sent    ok | allowed/s http   sip | RSS MB  gor"

func (r row) format() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%5.0fs %-6s |     ", r.At.Seconds(), r.Phase)
	for _, m := range r.Mem {
		fmt.Fprintf(&b, "%5.1f ", 100*m)
	}
	fmt.Fprintf(&b, "|          %4d %4d %5d |         %4d %4d %5d |          %4d %5d |          %5.1f %5.1f | %6.1f %4d",
		r.HTTPSent, r.HTTPAdmitted, r.HTTPRefused, r.SIPSent, r.SIPAdmitted, r.SIPRefused, r.AffSent, r.AffOK,
		r.HTTPAllowed, r.SIPAllowed, float64(r.RSS)/(1<<20), r.Goroutines)
	return b.String()
}

// summarize fills the peaks and the balancer's growth over the overload.
func (rep *report) summarize() {
	first := true
	for _, r := range rep.Rows {
		pm := rep.PhaseMem[r.Phase]
		if pm == nil {
			pm = make([]float64, len(r.Mem))
			rep.PhaseMem[r.Phase] = pm
			rep.Phases = append(rep.Phases, r.Phase)
		}
		for i, m := range r.Mem {
			pm[i] = max(pm[i], m)
			if r.Phase == phaseLoad {
				rep.MaxMem[i] = max(rep.MaxMem[i], m)
			}
		}
		rep.PeakRSS = max(rep.PeakRSS, r.RSS)
		rep.PeakGor = max(rep.PeakGor, r.Goroutines)
		if r.Phase == phaseLoad {
			if first {
				rep.LoadStartRSS, rep.LoadStartGor = r.RSS, r.Goroutines
				first = false
			}
			rep.LoadEndRSS, rep.LoadEndGor = r.RSS, r.Goroutines
		}
	}
}

// verdict lists every property that failed; none means the run passed.
func (rep *report) verdict() []string {
	var bad []string
	cfg := rep.Cfg
	if n := rep.AffHTTPSent - rep.AffHTTPOK; n > 0 {
		bad = append(bad, fmt.Sprintf("%d of %d sticky HTTP requests failed", n, rep.AffHTTPSent))
	}
	if n := rep.AffSIPSent - rep.AffSIPOK; n > 0 {
		bad = append(bad, fmt.Sprintf("%d of %d in-dialog SIP transactions failed", n, rep.AffSIPSent))
	}
	if rep.AffHTTPSent == 0 || rep.AffSIPSent == 0 {
		bad = append(bad, "no affinity traffic was sent")
	}
	for i, m := range rep.MaxMem {
		if m > cfg.MaxHeap+0.02 {
			bad = append(bad, fmt.Sprintf("backend %s memory reached %.1f%% in the overload, over the ceiling %.0f%% + 2 points", rep.Names[i], 100*m, 100*cfg.MaxHeap))
		}
	}
	if rep.NoRetryAfter > 0 {
		bad = append(bad, fmt.Sprintf("%d refusals without Retry-After", rep.NoRetryAfter))
	}
	if rep.NewLost > 0 {
		bad = append(bad, fmt.Sprintf("%d new-work requests got no answer", rep.NewLost))
	}
	if rep.HTTPRefused == 0 || rep.SIPRefused == 0 {
		bad = append(bad, fmt.Sprintf("no overload: HTTP refused %d, SIP refused %d in the overload phase", rep.HTTPRefused, rep.SIPRefused))
	}
	if rep.LoadStartGor == 0 || rep.LoadStartRSS == 0 {
		bad = append(bad, "no sample of the balancer's goroutines or memory in the overload phase")
	} else {
		if rep.LoadEndGor >= 2*rep.LoadStartGor+cfg.GoroutineSlack {
			bad = append(bad, fmt.Sprintf("goroutines grew from %d to %d (bound 2× + %d)", rep.LoadStartGor, rep.LoadEndGor, cfg.GoroutineSlack))
		}
		if rep.LoadEndRSS >= 2*rep.LoadStartRSS+cfg.RSSSlack {
			bad = append(bad, fmt.Sprintf("RSS grew from %.1f MB to %.1f MB (bound 2× + %.0f MB)", mb(rep.LoadStartRSS), mb(rep.LoadEndRSS), mb(cfg.RSSSlack)))
		}
	}
	return bad
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }

// print writes the summary and the verdict.
func (rep *report) print(w io.Writer) {
	pct := func(ok, sent uint64) float64 {
		if sent == 0 {
			return 0
		}
		return 100 * float64(ok) / float64(sent)
	}
	fmt.Fprintf(w, "\nlearned: %v; capacity HTTP %.1f/s, SIP %.1f/s; offered %.0f/s and %.0f/s (%.0f×) for %v\n",
		rep.Learned, rep.HTTPCap, rep.SIPCap, rep.HTTPOff, rep.SIPOff, rep.Cfg.Factor, rep.Cfg.Duration)
	fmt.Fprintf(w, "affinity: HTTP %d/%d ok (%.3f%%), SIP in-dialog %d/%d ok (%.3f%%)\n",
		rep.AffHTTPOK, rep.AffHTTPSent, pct(rep.AffHTTPOK, rep.AffHTTPSent), rep.AffSIPOK, rep.AffSIPSent, pct(rep.AffSIPOK, rep.AffSIPSent))
	fmt.Fprintf(w, "new work in the overload phase: HTTP sent %d, admitted %d (%.1f/s), refused %d; SIP sent %d, admitted %d (%.1f/s), refused %d\n",
		rep.HTTPSent, rep.HTTPAdmitted, float64(rep.HTTPAdmitted)/rep.Cfg.Duration.Seconds(), rep.HTTPRefused,
		rep.SIPSent, rep.SIPAdmitted, float64(rep.SIPAdmitted)/rep.Cfg.Duration.Seconds(), rep.SIPRefused)
	fmt.Fprintf(w, "refusals (whole run): %v; without Retry-After: %d; new work unanswered: %d; arrivals skipped (client at its bound): %d; SIP retransmissions: %d\n",
		rep.Refusals, rep.NoRetryAfter, rep.NewLost, rep.Skipped, rep.Retransmits)
	fmt.Fprintf(w, "backend memory peak by phase (ceiling %.0f%%):\n", 100*rep.Cfg.MaxHeap)
	for _, p := range rep.Phases {
		fmt.Fprintf(w, "  %-6s", p)
		for i, m := range rep.PhaseMem[p] {
			fmt.Fprintf(w, "  %s %5.1f%%", rep.Names[i], 100*m)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "balancer: RSS %.1f MB at the start of the overload, %.1f MB at its end, peak %.1f MB; goroutines %d, %d, peak %d\n",
		mb(rep.LoadStartRSS), mb(rep.LoadEndRSS), mb(rep.PeakRSS), rep.LoadStartGor, rep.LoadEndGor, rep.PeakGor)
	for _, f := range rep.Failures {
		fmt.Fprintln(w, "  affinity failure:", f)
	}
	for _, f := range rep.NoRA {
		fmt.Fprintln(w, "  refusal:", f)
	}
	for _, f := range rep.Lost {
		fmt.Fprintln(w, "  unanswered:", f)
	}
	if bad := rep.verdict(); len(bad) > 0 {
		fmt.Fprintln(w, "VERDICT: FAIL")
		for _, b := range bad {
			fmt.Fprintln(w, "  -", b)
		}
		return
	}
	fmt.Fprintln(w, "VERDICT: PASS")
}
