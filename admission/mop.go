package admission

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// MOPPhase is where a backend's memory overload protection stands.
type MOPPhase uint32

// MOP phases.
const (
	// Discovery: no rate learned yet; the allowed rate starts low and rises
	// window by window while the backend's memory stays under the ceiling.
	Discovery MOPPhase = iota
	// Learned: a safe rate is known; it keeps adapting slowly.
	Learned
)

// String returns "discovery" or "learned".
func (p MOPPhase) String() string {
	if p == Learned {
		return "learned"
	}
	return "discovery"
}

// MOPConfig configures one backend's memory overload protection.
type MOPConfig struct {
	// Name identifies the backend in events, e.g. "http 127.0.0.1:18081".
	Name string
	// MaxHeap is the memory ceiling as a fraction of the backend's maximum
	// memory, in (0,1). Flag -mop-max-heap, default 0.85.
	MaxHeap float64
	// Window is the averaging window: at least as long as most sessions or
	// dialogs live. A rate is held for one window before it is judged.
	// Flag -mop-window, default 60s.
	Window time.Duration
	// InitialRate is the allowed rate of new work per second when nothing is
	// learned. Flag -mop-initial-rate, default 10.
	InitialRate float64
	// MinRate is the floor of the allowed rate, per second. Default 1.
	MinRate float64
	// Burst is how much work may be sent at once, as a duration at the
	// allowed rate (GCRA tolerance): max(1, rate × Burst) requests.
	// Default 1s: MOP guards memory that builds up over a session's
	// lifetime (seconds to minutes), so a second's worth arriving at once
	// changes nothing for the backend, while a tighter tolerance refuses
	// clients whose arrivals merely jitter around a rate under the
	// allowed one (Poisson arrivals at half the rate with 100 ms of
	// tolerance see refusals).
	Burst time.Duration
	// Margin is the fraction below the predicted safe rate that is allowed,
	// to absorb noise. Default 0.03.
	Margin float64
	// Events receives phase changes and learned-rate updates. May be nil.
	Events EventSink

	// doubling selects the earlier discovery, which starts at InitialRate
	// and at most doubles the rate per window: kept as the baseline that
	// the tests and the README's table compare against.
	doubling bool
	// windowOnly turns the lifetime estimate's bound off: discovery
	// bounded by the window alone, kept as the baseline of the tests and
	// the README's table.
	windowOnly bool
}

// DefaultMOPRejectCode is the HTTP status when every backend's MOP
// refuses (ControllerConfig.MOPRejectCode, flag -mop-reject-code).
const DefaultMOPRejectCode = 503

// DefaultMOPConfig returns the defaults of every field but Name and
// Events: the one place they are written (the -mop-* flags show them;
// zero fields are filled from here).
func DefaultMOPConfig() MOPConfig {
	return MOPConfig{MaxHeap: 0.85, Window: 60 * time.Second, InitialRate: 10, MinRate: 1, Burst: time.Second, Margin: 0.03}
}

func (c *MOPConfig) setDefaults() {
	d := DefaultMOPConfig()
	if c.MaxHeap == 0 {
		c.MaxHeap = d.MaxHeap
	}
	if c.Window == 0 {
		c.Window = d.Window
	}
	if c.InitialRate == 0 {
		c.InitialRate = d.InitialRate
	}
	if c.MinRate == 0 {
		c.MinRate = d.MinRate
	}
	if c.Burst == 0 {
		c.Burst = d.Burst
	}
	if c.Margin == 0 {
		c.Margin = d.Margin
	}
}

// Validate reports the first invalid field, naming its flag.
func (c MOPConfig) Validate() error {
	switch {
	case !(c.MaxHeap > 0 && c.MaxHeap < 1):
		return fmt.Errorf("-mop-max-heap must be in (0,1) (got %g)", c.MaxHeap)
	case c.Window <= 0:
		return errors.New("-mop-window must be positive")
	case !(c.InitialRate > 0):
		return fmt.Errorf("-mop-initial-rate must be positive (got %g)", c.InitialRate)
	case c.MinRate <= 0 || c.MinRate > c.InitialRate:
		return fmt.Errorf("mop minimum rate must be in (0, initial rate] (got %g)", c.MinRate)
	case c.Burst < 0:
		return errors.New("mop burst must not be negative")
	case c.Margin < 0 || c.Margin >= 0.5:
		return fmt.Errorf("mop margin must be in [0, 0.5) (got %g)", c.Margin)
	}
	return nil
}

// Bounds of what MOP takes as true.
const (
	// MaxMOPRate is the highest rate MOP allows, learns or imports, per
	// second: far above what one backend takes as new work, low enough
	// that a rate at it still limits.
	MaxMOPRate = 1e6
	// MaxMemoryBytes is the largest used or max memory a sample may report
	// (1 EB); beyond it the reading is made up.
	MaxMemoryBytes = 1e18
	// UsedOverMax is how far used memory may exceed max in a sample, as a
	// fraction of max: pools read at slightly different moments. Beyond
	// it the reading is made up.
	UsedOverMax = 0.02
)

// ErrBadMemorySample is wrapped by CheckMemorySample, and so by Observe,
// for a reading that cannot be true.
var ErrBadMemorySample = errors.New("impossible memory reading")

// CheckMemorySample reports why a backend's used and max memory, in bytes,
// cannot be true: not finite, used negative, max not positive, either over
// MaxMemoryBytes, or used over max by more than UsedOverMax.
func CheckMemorySample(used, max float64) error {
	switch {
	case math.IsNaN(used) || math.IsInf(used, 0) || used < 0:
		return fmt.Errorf("%w: used %g bytes is not a finite non-negative number", ErrBadMemorySample, used)
	case math.IsNaN(max) || math.IsInf(max, 0) || max <= 0:
		return fmt.Errorf("%w: max %g bytes is not a finite positive number", ErrBadMemorySample, max)
	case used > MaxMemoryBytes || max > MaxMemoryBytes:
		return fmt.Errorf("%w: used %g or max %g bytes over %g", ErrBadMemorySample, used, max, float64(MaxMemoryBytes))
	case used > max*(1+UsedOverMax):
		return fmt.Errorf("%w: used %g bytes over max %g by more than %g%%", ErrBadMemorySample, used, max, 100*UsedOverMax)
	}
	return nil
}

// MOPState is the learned state of one backend as a plain value, for
// persist/ to store and give back to Import after a restart.
type MOPState struct {
	Phase       MOPPhase  `json:"phase"`
	LearnedRate float64   `json:"learned_rate"` // requests per second; 0 when nothing is learned
	AllowedRate float64   `json:"allowed_rate"` // requests per second
	Base        float64   `json:"base"`         // fitted memory fraction at zero rate
	Slope       float64   `json:"slope"`        // fitted memory fraction per (request per second)
	UpdatedAt   time.Time `json:"updated_at"`   // wall time of the last change
	// Provisional marks a rate moved by a single memory sample that no
	// later sample has confirmed yet: it is in force and shared with a
	// cluster, but persist/ keeps the state stored before it.
	Provisional bool `json:"provisional,omitempty"`
	// The lifetime estimate (MOPStatus has the same fields); all 0 in a
	// state saved before there was one, which loads as "nothing
	// estimated".
	Lifetime        time.Duration `json:"lifetime_ns,omitempty"`       // median session lifetime
	LifetimeHigh    time.Duration `json:"lifetime_high_ns,omitempty"`  // 95th percentile
	BytesPerSession float64       `json:"bytes_per_session,omitempty"` // memory one live session holds, bytes
	SessionMemory   float64       `json:"session_memory,omitempty"`    // memory fraction per (session per second) at a steady rate
	SessionBase     float64       `json:"session_base,omitempty"`      // memory fraction with no session live, by the estimate
}

// MOPStatus is a point-in-time view for /status and metrics.
type MOPStatus struct {
	Phase          MOPPhase
	AllowedRate    float64 // per second
	LearnedRate    float64 // per second; 0 while discovering
	MemoryFraction float64 // last sampled used/max of the backend; 0 when unknown
	MemoryKnown    bool    // a sample was taken and the probe has not failed since
	ProbeError     string  // why the last probe failed; "" when it worked
	ProbeFailures  uint64  // failed probes since start
	Admitted       uint64  // new work admitted since start
	Refused        uint64  // new work refused since start
	// What the memory's answer to changes in the admitted rate says of
	// the sessions (moplife.go); all 0 while nothing is estimated.
	Lifetime        time.Duration // median session lifetime
	LifetimeHigh    time.Duration // 95th percentile of the session lifetime
	BytesPerSession float64       // memory one live session holds, bytes
	PredictedMemory float64       // predicted memory at the allowed rate held steady, fraction of the backend's max
}

// MOP is memory overload protection for one backend. Allow is the hot path:
// GCRA on one atomic word, no mutex, no allocation. Observe feeds memory
// samples from a probe and drives learning under a mutex. A nil *MOP allows
// everything. Safe for concurrent use.
type MOP struct {
	cfg MOPConfig

	// Hot path. tat is written by every refill: it has a cache line of its
	// own, away from the read-mostly settings and the shards.
	_        [64]byte
	tat      atomic.Int64 // GCRA theoretical arrival time, monotonic ns
	_        [56]byte
	emission atomic.Int64 // ns between admissions at the allowed rate
	tau      atomic.Int64 // GCRA tolerance, ns
	batch    atomic.Int64 // admissions reserved per CAS on tat (see shard.go)
	_        [40]byte
	shards   shards // parked reservations and the refusal counts

	// Published for readers.
	phase   atomic.Uint32
	allowed atomic.Uint64 // float64 bits
	learned atomic.Uint64 // float64 bits
	memFrac atomic.Uint64 // float64 bits
	// The lifetime estimate, float64 bits: median and high lifetime
	// (ns), bytes per session, memory fraction per (request per
	// second) and the base, published by Observe.
	estMed, estHigh, estBytes, estPerRate, estBase atomic.Uint64
	pinned                                         atomic.Uint64 // float64 bits of the rate an operator pinned; 0: learning (mopcontrol.go)

	// The memory probe's health (ProbeFailed, Observe).
	memKnown  atomic.Bool
	probeErr  atomic.Pointer[string]
	probeFail atomic.Uint64

	// Cluster hooks (see mopshare.go); nil or false on a standalone node.
	lease    atomic.Pointer[Lease]
	source   atomic.Pointer[countSource]
	follower atomic.Bool

	spans [lifeN]int64 // the lifetime estimate's candidate lifetimes, ns (moplife.go); set by NewMOP

	mu sync.Mutex // guards the learner below
	l  learner
}

// learner is the slow-path state of MOP, guarded by MOP.mu.
type learner struct {
	started     bool
	winStart    int64
	admitted0   uint64
	refused0    uint64
	lateSum     float64 // memory fractions sampled in the last quarter of the window
	lateMax     float64 // and the highest of them
	lateN       int
	last        float64
	fit         fit
	base, slope float64 // model in use: memory ≈ base + slope × rate
	haveModel   bool
	crossed     bool    // memory passed the ceiling during this window
	prevRate    float64 // admitted rate of the previous window
	cutSeen     bool
	lastCutMem  float64 // memory fraction that caused it

	hist    history // recent samples, for the discovery bound
	midRate float64 // allowed rate half way through the window (discovery)
	midSet  bool
	capped  bool                  // the bound, not demand, held the rate in the window's second half
	fits    [len(fitSpans)][2]fit // discovery: memory against the rate over each span, now and one sample late

	discStart int64 // first sample of discovery

	life [2]lifeFit     // memory against the work admitted over each candidate lifetime, now and one sample late
	est  lifeEstimate   // what they say
	rhoH [lifeN]float64 // lowest trailing admitted rate over spans up to each candidate lifetime, per second

	regimeBytes, regimeLife float64           // the estimate of the last regime: memory fraction per session, median lifetime (ns)
	regimeRun               int               // samples in a row far from it
	lifeStart               int64             // since when the lifetime fits hold only data of the present regime (0: discovery's start)
	shiftRun                int               // samples in a row the fit missed by more than shiftSD residual deviations, one way
	shiftSign               float64           // which way
	shift                   lifeShift         // the estimate across the last change point
	lowMem                  float64           // lowest memory sample of the last window
	cutAt, cutLife          int64             // time of the last cut, and how long memory takes to answer it (0: a window)
	exactRing               [lifeRing]float64 // the estimate's memory per unit of rate at the last samples
	exactN                  int
	exactMax                float64 // the highest of them; 0 unless all are known
	shiftCut                int64   // the change point (lifeShift.at) the estimate last cut the rate after
	rampAt                  int64   // time of a ramp cut not yet confirmed by a change point (0: none)
	rampFrom, rampRate      float64 // the allowed rate before it, and the one it set
	rampUp                  float64 // the plateau's safe rate a ramp cut goes back up to once memory stops rising (0: none)
	deepFloor               float64 // the cut floor a change point's cut went under, which deepRecover may go back up to (0: none)

	rise     float64 // mean rise of memory between samples beyond its trend, recently
	headroom float64 // headroomBound at the last sample, per second
	proven   float64 // the highest finite headroomBound since discovery began or memory last passed the ceiling
	rho      float64 // and its lowest trailing admitted rate, per second
	mem      float64 // and the memory it judged (recent peak plus the rise between samples)

	unpinned float64 // the allowed rate before Pin, restored by Unpin

	winAllowed float64 // the allowed rate when the window began: a cut goes at most to half of it
	lateOver   int     // samples over the ceiling in the last quarter of the window
	// prov: the learned rate was moved by one sample that nothing since
	// confirmed (see MOPState.Provisional; markProvisional); provAt is
	// that sample's time, provRate the learned rate before it (0:
	// discovery, which only a confirmation ends).
	prov        bool
	provAt      int64
	provRate    float64
	provAllowed float64 // the allowed rate before it
}

// mopSample is one memory sample with the admission counters at its time.
type mopSample struct {
	at       int64   // monotonic ns
	admitted uint64  // admitted since start
	refused  uint64  // refused since start
	mem      float64 // used/max as reported
}

// history is a ring of recent samples, at most histCap, at least minGap
// apart, so that it always spans more than the bound's horizon whatever
// the probe interval.
type history struct {
	s      []mopSample
	head   int // index of the newest
	n      int
	minGap int64
}

const (
	histCap     = 512
	histPerHorz = 200 // samples kept per horizon at most
)

func (h *history) add(x mopSample) {
	if h.s == nil {
		h.s = make([]mopSample, histCap)
	}
	if h.n > 0 && x.at-h.s[h.head].at < h.minGap {
		return
	}
	h.head = (h.head + 1) % len(h.s)
	h.s[h.head] = x
	if h.n < len(h.s) {
		h.n++
	}
}

// at returns the i-th newest sample (0: the newest).
func (h *history) at(i int) mopSample {
	return h.s[(h.head-i+len(h.s))%len(h.s)]
}

// NewMOP validates cfg and returns a limiter in Discovery at InitialRate.
func NewMOP(cfg MOPConfig) (*MOP, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &MOP{cfg: cfg}
	for j := range m.spans {
		m.spans[j] = lifeSpan(int64(cfg.Window), j)
	}
	m.setAllowed(cfg.InitialRate)
	return m, nil
}

// Allow reports whether one request of new work may go to the backend now
// and counts it. It never blocks.
func (m *MOP) Allow(now int64) bool {
	if m == nil {
		return true
	}
	if l := m.lease.Load(); l != nil {
		return m.allowLeased(now, l)
	}
	return m.allowLocal(now, 1)
}

// allowLocal is the GCRA at the allowed rate divided by div.
func (m *MOP) allowLocal(now, div int64) bool {
	sh := m.shards.pick()
	tick := uint32(now >> 20) // reservations live for one ~1ms tick
	if sh.take(tick) {
		return true
	}
	t := m.emission.Load() * div
	tau := m.tau.Load()
	batch := m.batch.Load()
	for {
		tat := m.tat.Load()
		next := tat
		if next < now {
			next = now
		}
		ahead := next - now
		if ahead > tau {
			sh.refused.Add(1)
			return false
		}
		n := min(batch, (tau-ahead)/t+1) // only what the tolerance allows
		if m.tat.CompareAndSwap(tat, next+n*t) {
			sh.granted.Add(uint64(n))
			if n > 1 {
				sh.park(tick, uint64(n-1)) // a displaced batch is simply unused
			}
			return true
		}
	}
}

// counts returns how much new work was admitted and refused since start.
// At rates high enough to reserve in batches, admitted includes
// reservations that went unused (a few per millisecond at most).
func (m *MOP) counts() (admitted, refused uint64) {
	if src := m.source.Load(); src != nil {
		return (*src)()
	}
	return m.shards.granted(), m.shards.refused()
}

// Headroom returns how many requests Allow would admit at now without
// waiting: a tie-breaker for selection. It is 0 when the backend is at its rate.
func (m *MOP) Headroom(now int64) float64 {
	if m == nil {
		return math.Inf(1)
	}
	t := float64(m.emission.Load())
	ahead := float64(m.tat.Load() - now)
	if ahead < 0 {
		ahead = 0
	}
	h := (float64(m.tau.Load()) - ahead + t) / t
	if h < 0 {
		return 0
	}
	return h
}

// RetryAfter is how long until Allow would admit again.
func (m *MOP) RetryAfter(now int64) time.Duration {
	if m == nil {
		return 0
	}
	d := m.tat.Load() - m.tau.Load() - now
	if d < 0 {
		return 0
	}
	return time.Duration(d)
}

// setAllowed publishes a new allowed rate for the hot path.
func (m *MOP) setAllowed(rate float64) {
	rate = min(max(rate, m.cfg.MinRate), MaxMOPRate)
	m.allowed.Store(math.Float64bits(rate))
	emission := int64(float64(time.Second) / rate)
	if emission < 1 {
		emission = 1
	}
	// Up to max(1, rate × Burst) requests may go at once: tolerance is
	// that many emission intervals less one.
	burst := math.Floor(rate * m.cfg.Burst.Seconds())
	tau := int64(0)
	if burst > 1 {
		tau = int64((burst - 1) * float64(emission))
	}
	m.emission.Store(emission)
	m.tau.Store(tau)
	// Reserve in batches only at rates where one tick holds many requests.
	m.batch.Store(int64(max(1, min(maxMOPBatch, rate/2000))))
}

func loadF(a *atomic.Uint64) float64 { return math.Float64frombits(a.Load()) }

// Status returns the current view.
func (m *MOP) Status() MOPStatus {
	if m == nil {
		return MOPStatus{}
	}
	admitted, refused := m.counts()
	probeErr := ""
	if p := m.probeErr.Load(); p != nil {
		probeErr = *p
	}
	return MOPStatus{
		Phase:           MOPPhase(m.phase.Load()),
		AllowedRate:     loadF(&m.allowed),
		LearnedRate:     loadF(&m.learned),
		MemoryFraction:  loadF(&m.memFrac),
		MemoryKnown:     m.memKnown.Load(),
		ProbeError:      probeErr,
		ProbeFailures:   m.probeFail.Load(),
		Admitted:        admitted,
		Refused:         refused,
		Lifetime:        time.Duration(loadF(&m.estMed)),
		LifetimeHigh:    time.Duration(loadF(&m.estHigh)),
		BytesPerSession: loadF(&m.estBytes),
		PredictedMemory: predicted(loadF(&m.estBase), loadF(&m.estPerRate), loadF(&m.allowed)),
	}
}

// predicted is the memory a steady rate holds by the estimate: 0 when
// there is none.
func predicted(base, perRate, rate float64) float64 {
	if !(perRate > 0) {
		return 0
	}
	return base + perRate*rate
}

// Export returns the learned state as a plain value.
func (m *MOP) Export() MOPState {
	m.mu.Lock()
	defer m.mu.Unlock()
	allowed := loadF(&m.allowed)
	if m.pinned.Load() != 0 {
		allowed = m.l.unpinned // a pin is kept as an override, not as learned
	}
	return MOPState{
		Phase:       MOPPhase(m.phase.Load()),
		LearnedRate: loadF(&m.learned),
		AllowedRate: allowed,
		Base:        m.l.base,
		Slope:       m.l.slope,
		UpdatedAt:   time.Now(),
		Provisional: m.l.prov && !(m.l.provRate > 0 && loadF(&m.learned) >= m.l.provRate),

		Lifetime:        time.Duration(loadF(&m.estMed)),
		LifetimeHigh:    time.Duration(loadF(&m.estHigh)),
		BytesPerSession: loadF(&m.estBytes),
		SessionMemory:   loadF(&m.estPerRate),
		SessionBase:     loadF(&m.estBase),
	}
}

// estimateValid reports whether s's session estimate can be true: finite,
// not negative, bytes within MaxMemoryBytes, and the session memory and
// base not over the backend's whole memory.
func estimateValid(s MOPState) bool {
	for _, v := range [...]float64{float64(s.Lifetime), float64(s.LifetimeHigh), s.BytesPerSession, s.SessionMemory, s.SessionBase} {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > MaxMemoryBytes {
			return false
		}
	}
	return s.SessionBase <= 1 && s.SessionMemory <= 1
}

// Import restores a state from Export. A Learned state is admitted at its
// learned rate from the first window on; a Discovery state resumes at its
// allowed rate. A state with no positive rate, or whose rate in use is
// outside [MinRate, MaxMOPRate], is refused with an error and changes
// nothing: the limiter goes on as it was. A session estimate that cannot
// be true is dropped (learned again) without refusing the rate.
func (m *MOP) Import(s MOPState) error {
	if !(s.AllowedRate > 0) && !(s.LearnedRate > 0) {
		return fmt.Errorf("mop %s: imported state has no rate", m.cfg.Name)
	}
	if math.IsNaN(s.Base) || math.IsNaN(s.Slope) || math.IsInf(s.Base, 0) || math.IsInf(s.Slope, 0) ||
		math.IsNaN(s.LearnedRate) || math.IsNaN(s.AllowedRate) || math.IsInf(s.LearnedRate, 0) || math.IsInf(s.AllowedRate, 0) {
		return fmt.Errorf("mop %s: imported state is not finite", m.cfg.Name)
	}
	if !estimateValid(s) {
		// The session estimate only speeds discovery up; the rate is
		// what the state is kept for. One that cannot be true (a damaged
		// store, a hostile peer) is dropped and learned again, and the
		// rate, checked on its own below, is still restored.
		s.Lifetime, s.LifetimeHigh, s.BytesPerSession, s.SessionMemory, s.SessionBase = 0, 0, 0, 0, 0
	}
	rate := s.AllowedRate
	if s.Phase == Learned && s.LearnedRate > 0 {
		rate = s.LearnedRate
	}
	if rate < m.cfg.MinRate || rate > MaxMOPRate {
		return fmt.Errorf("mop %s: imported rate %g/s outside [%g, %g]", m.cfg.Name, rate, m.cfg.MinRate, float64(MaxMOPRate))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.Phase == Learned && s.LearnedRate > 0 {
		m.learned.Store(math.Float64bits(s.LearnedRate))
	}
	m.l.prov = s.Provisional
	m.l.provRate = math.Inf(1) // cleared only by the state that confirms it
	m.phase.Store(uint32(s.Phase))
	if s.Slope > 0 {
		m.l.base, m.l.slope, m.l.haveModel = s.Base, s.Slope, true
	}
	m.setAllowed(rate)
	m.estMed.Store(math.Float64bits(float64(s.Lifetime)))
	m.estHigh.Store(math.Float64bits(float64(s.LifetimeHigh)))
	m.estBytes.Store(math.Float64bits(s.BytesPerSession))
	m.estPerRate.Store(math.Float64bits(s.SessionMemory))
	m.estBase.Store(math.Float64bits(s.SessionBase))
	return nil
}

// Observe feeds one memory sample of the backend (used and maximum bytes)
// taken at now, and judges the window when it has ended. It is called by the
// backend's memory probe, never on a request's path. A sample with used
// negative, max not positive or either over MaxMemoryBytes is not used: it
// counts as a failed probe (ProbeFailed) and its error, wrapping
// ErrBadMemorySample, is returned. Used over max is taken as given (a
// simulated backend past its memory); probes refuse it beyond UsedOverMax
// with CheckMemorySample before calling Observe.
func (m *MOP) Observe(now int64, used, max int64) error {
	if m == nil {
		return nil
	}
	u := float64(used)
	if used > max && u <= MaxMemoryBytes {
		u = float64(max) // over max is taken as given, see above
	}
	if err := CheckMemorySample(u, float64(max)); err != nil {
		err = fmt.Errorf("mop %s: %w", m.cfg.Name, err)
		m.ProbeFailed(err)
		return err
	}
	frac := float64(used) / float64(max)
	m.memFrac.Store(math.Float64bits(frac))
	m.memKnown.Store(true)
	m.probeErr.Store(nil)
	if m.follower.Load() {
		return nil // another node learns for the cluster; Import brings its rates
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pinned.Load() != 0 {
		return nil // an operator holds the rate: nothing is learned (Pin, under mu)
	}
	l := &m.l
	if !l.started {
		m.startWindow(now)
	}
	w := int64(m.cfg.Window)
	for now-l.winStart >= w {
		m.judgeWindow(l.winStart + w)
	}
	l.last = frac
	if now-l.winStart >= w*3/4 {
		l.lateSum += frac
		l.lateMax = math.Max(l.lateMax, frac)
		l.lateN++
		if frac > m.cfg.MaxHeap {
			l.lateOver++
		}
	}
	if l.prov && now > l.provAt && frac > m.cfg.MaxHeap {
		l.prov = false // a second sample over the ceiling: the cut stands
	}
	switch {
	case frac <= m.cfg.MaxHeap:
		l.cutSeen = false // the episode over the ceiling has ended
	case !l.crossed && (!l.cutSeen || frac > l.lastCutMem):
		// Do not wait for the window to end: cut now. But memory lags the
		// rate by up to a session lifetime, so while memory stays over the
		// ceiling only memory still rising past the last cut's level cuts
		// again mid-window.
		l.crossed = true
		m.cut(now, frac, true)
	case l.crossed && l.cutLife > 0 && !m.cfg.windowOnly && now-l.cutAt >= l.cutLife && frac > m.cfg.MaxHeap+m.cfg.Margin*(1-m.cfg.MaxHeap):
		// Sessions known to live much less than the window answer a
		// cut within their lifetime: memory still well over the
		// ceiling that long after the last cut cuts again, within
		// the window (never under cutFloor, so one window at most
		// halves the rate). A deploy that doubles the memory of a
		// session is followed down within a window, not five.
		m.cut(now, frac, false)
	}
	admitted, refused := m.counts()
	if l.hist.n == 0 {
		l.discStart = now
	}
	l.headroom, l.rho = m.headroomBound(now, admitted, frac)
	m.addLifePoints(now, admitted, frac, float64(max))
	m.rampRecover(frac)
	m.deepRecover(frac)
	m.estimateCut(now, frac)
	m.drainCut(now, frac)
	if !math.IsInf(l.headroom, 1) {
		l.proven = math.Max(l.proven, l.headroom)
	}
	if MOPPhase(m.phase.Load()) == Discovery && !l.crossed && !m.cfg.doubling {
		m.discover(now, frac, admitted, refused)
	}
	l.hist.minGap = int64(m.cfg.Window) / histPerHorz
	l.hist.add(mopSample{at: now, admitted: admitted, refused: refused, mem: frac})
	return nil
}

// ProbeFailed records that the backend's memory could not be read (err
// says why): its memory is unknown until the next good sample, and
// nothing is learned meanwhile. It is counted in ProbeFailures.
func (m *MOP) ProbeFailed(err error) {
	if m == nil || err == nil {
		return
	}
	msg := err.Error()
	m.memKnown.Store(false)
	m.probeErr.Store(&msg)
	m.probeFail.Add(1)
}

func (m *MOP) startWindow(now int64) {
	l := &m.l
	l.started = true
	l.winStart = now
	l.admitted0, l.refused0 = m.counts()
	l.lateSum, l.lateMax, l.lateN, l.lateOver = 0, 0, 0, 0
	l.winAllowed = loadF(&m.allowed)
	l.crossed = false
	l.midSet, l.capped = false, false
}

// judgeDoubling is the discovery step of the baseline: while demand is
// refused, double the rate, capped by the window fit's prediction.
func (m *MOP) judgeDoubling(allowed, mem float64, demandLimited bool) {
	l := &m.l
	if b, s, ok := l.fit.line(); ok && s > 0 {
		l.base, l.slope, l.haveModel = b, s, true
	}
	if !demandLimited {
		return
	}
	next := allowed * 2
	if l.haveModel {
		next = math.Min(next, m.safeRate())
	}
	if next <= allowed*1.02 {
		m.learn(allowed, fmt.Sprintf("rate %.1f/s held a window at %.1f%% memory", allowed, 100*mem))
		return
	}
	m.setAllowed(next)
}

// setModel fixes the model the Learned phase adapts: the best sample fit's
// line through the peaks when there is one, else the line from the base of
// the window fit (or 0, which overstates the slope and so errs low) to the
// point (rate, mem) reached.
func (m *MOP) setModel(now int64, rate, mem float64) {
	l := &m.l
	if r, b, s := m.fitBound(now); r > 0 && b >= 0 && b < mem {
		l.base, l.slope, l.haveModel = b, s, true
		return
	}
	base := 0.0
	if b, s, ok := l.fit.line(); ok && s > 0 {
		base = math.Max(0, math.Min(b, 0.9*mem))
	}
	l.base, l.slope, l.haveModel = base, (mem-base)/rate, true
}

// cut lowers the allowed rate after memory passed the ceiling. With a
// model, the rate is scaled by how far over the ceiling memory is (memory
// above the base grows with the rate); without one it drops by 30%. It
// never goes under cutFloor. oneSample says that a single sample over the
// ceiling is all the evidence: the learned rate is then provisional
// (not persisted) until a later sample over the ceiling confirms it.
func (m *MOP) cut(now int64, frac float64, oneSample bool) {
	l := &m.l
	if oneSample {
		m.markProvisional(now)
	}
	rate := loadF(&m.allowed)
	next := rate * 0.7
	if !l.haveModel && !m.cfg.doubling && l.rho > 0 {
		// Discovery ends here: memory reflects the rate admitted over
		// the last lifetime, ρ, not the allowed rate.
		m.setModel(now, l.rho, frac)
		next = math.Min(next, m.safeRate())
	} else if l.haveModel && frac > l.base && m.cfg.MaxHeap > l.base {
		next = rate * (m.cfg.MaxHeap - l.base) / (frac - l.base) * (1 - m.cfg.Margin)
	}
	l.lastCutMem, l.cutSeen, l.cutAt = frac, true, now
	l.cutLife = 0
	if e := &l.est; e.ok && e.observed >= int64(m.cfg.Window) && 4*e.high <= float64(m.cfg.Window) {
		l.cutLife = int64(2*e.high) + int64(2*time.Second)
	}
	l.proven = 0
	m.setAllowed(math.Max(next, m.cutFloor()))
	if MOPPhase(m.phase.Load()) == Discovery {
		m.learn(loadF(&m.allowed), "memory passed the ceiling during discovery")
	} else {
		m.learn(loadF(&m.allowed), fmt.Sprintf("memory at %.1f%% passed the ceiling", 100*frac))
	}
}

// markProvisional records, before a change of the learned rate that one
// sample made, what it changes: Export marks the state provisional until
// a later sample over the ceiling, or a later window whose own samples
// put the safe rate under the allowed rate before the change, confirms
// it, or until the learned rate is back where it was.
func (m *MOP) markProvisional(now int64) {
	l := &m.l
	if !l.prov {
		l.prov, l.provAt, l.provRate, l.provAllowed = true, now, loadF(&m.learned), loadF(&m.allowed)
	}
}

// cutFloor is the lowest rate a cut may set: half the allowed rate when the
// window began, so that one sample, true or not, at most halves the rate
// in a window (memory answers a rate only a lifetime later; a second
// window over the ceiling halves it again). In discovery the allowed rate
// may have run ahead of what was admitted, which is what memory shows:
// there it is half the lower of that rate and the trailing admitted rate
// ρ.
func (m *MOP) cutFloor() float64 {
	f := m.l.winAllowed / 2
	if MOPPhase(m.phase.Load()) == Discovery && m.l.rho > 0 {
		f = math.Min(f, m.l.rho/2)
	}
	return f
}

// learn records rate as the learned rate and enters the Learned phase.
func (m *MOP) learn(rate float64, why string) {
	old := loadF(&m.learned)
	m.learned.Store(math.Float64bits(rate))
	if MOPPhase(m.phase.Swap(uint32(Learned))) != Learned {
		m.cfg.Events.emit(EventMOPPhase, m.cfg.Name, "mop phase discovery -> learned: "+why)
	}
	if math.Abs(rate-old) > 0.01*math.Max(rate, old) {
		m.cfg.Events.emit(EventMOPLearned, m.cfg.Name, fmt.Sprintf("learned rate %.1f/s -> %.1f/s", old, rate))
	}
}

// judgeWindow ends the window that closes at end: it fits the point
// (windowed admitted rate, memory) and sets the next allowed rate.
func (m *MOP) judgeWindow(end int64) {
	l := &m.l
	secs := m.cfg.Window.Seconds()
	a, r := m.counts()
	admitted, refused := a-l.admitted0, r-l.refused0
	rate := float64(admitted) / secs
	demandLimited := refused > 0
	mem := l.last
	if l.lateN > 0 {
		// The peak, not the mean: the promise is about the highest
		// memory, and a collected heap peaks well above its mean, by up
		// to a rise between samples above the highest sample.
		mem = l.lateMax + l.rise
	}
	if l.lateN > 0 && m.cfg.doubling {
		mem = l.lateSum / float64(l.lateN)
	}
	haveMem := l.lateN > 0
	oneSample := l.lateOver < 2 // at most one late sample over the ceiling
	crossed := l.crossed
	midSet, midRate, capped := l.midSet, l.midRate, l.capped
	m.startWindow(end)
	if !haveMem {
		return // no sample late in the window: nothing to judge
	}
	allowed := loadF(&m.allowed)
	ceiling := m.cfg.MaxHeap
	phase := MOPPhase(m.phase.Load())

	// A window is steady when its rate is within 10% of the previous one:
	// only then does its memory reflect its rate (memory lags by a lifetime).
	steady := l.prevRate > 0 && math.Abs(rate-l.prevRate) <= 0.1*math.Max(rate, l.prevRate)
	l.prevRate = rate

	if phase == Discovery {
		if crossed {
			return // cut and learned mid-window
		}
		if rate > 0 {
			l.fit.add(rate, mem)
		}
		if mem > ceiling {
			m.cut(end, mem, oneSample)
			return
		}
		if m.cfg.doubling {
			m.judgeDoubling(allowed, mem, demandLimited)
			return
		}
		near := mem >= m.cfg.MaxHeap*(1-m.cfg.Margin)-0.02
		if demandLimited && capped && near && midSet && rate > 0 && math.Abs(allowed-midRate) <= 0.05*allowed {
			// Demand was refused, the bound held the rate steady for half
			// a window, and memory peaks near the ceiling: learned.
			m.setModel(end, math.Max(rate, l.rho), mem)
			m.learn(allowed, fmt.Sprintf("rate %.1f/s held at %.1f%% memory", allowed, 100*mem))
		}
		return
	}

	// Learned: adapt slowly. A window with a cut is held so that the cut
	// can take effect; memory still over the ceiling after a steady window
	// cuts again.
	if crossed {
		return
	}
	if mem > ceiling {
		if steady {
			m.cut(end, mem, oneSample)
		}
		return
	}
	refit := steady && l.haveModel && rate >= 0.2*allowed && mem > l.base
	if refit {
		// With a steady rate the intercept cannot be refitted: keep the
		// base and re-estimate the slope from this window.
		l.slope = (mem - l.base) / rate
	}
	if !l.haveModel {
		return
	}
	safe := m.safeRate()
	if refit && l.prov && end > l.provAt && safe < l.provAllowed {
		l.prov = false // a window of its own says the earlier rate was too high
	}
	next := allowed
	switch {
	case safe < allowed:
		next = math.Max(safe, allowed/2) // at most halved a window, as by a cut
		// The window's peak, which set the slope, may be one sample.
		m.markProvisional(end)
	case demandLimited && safe > allowed:
		// Creep up, but not past what the samples prove safe: the
		// model may miss peaks (a collected heap) that they show.
		next = math.Max(allowed, math.Min(math.Min(safe, allowed*1.1), l.headroom))
	}
	if next != allowed {
		m.setAllowed(next)
		m.learn(loadF(&m.allowed), fmt.Sprintf("adapted at %.1f%% memory", 100*mem))
	}
}

// safeRate is the model's rate at the ceiling, less the margin.
func (m *MOP) safeRate() float64 {
	return (m.cfg.MaxHeap - m.l.base) / m.l.slope * (1 - m.cfg.Margin)
}
