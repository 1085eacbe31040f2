package admission

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// IntervalRow is one row of the TDWM seed's table: what happened to one rule
// in one sub-interval.
type IntervalRow struct {
	Interval int           `json:"interval"` // from 1
	Start    time.Duration `json:"-"`        // offset of the sub-interval's start
	Arrived  int           `json:"arrived"`
	Admitted int           `json:"admitted"` // admitted on arrival
	Released int           `json:"released"` // admitted from the delay queue
	Refused  int           `json:"refused"`
	Rate     int64         `json:"rate"`   // arrival rate after the interval
	Queued   int64         `json:"queued"` // delay queue length after the interval
}

// Simulate replays arrivals, given per sub-interval, through one rule in the
// Normal memory state, in fake time. Within a sub-interval the order is:
// expiry of the oldest sub-interval, release of delayed requests, then that
// interval's arrivals. It is the engine of `sluice simulate` and of the
// golden tests.
func Simulate(rc RuleConfig, arrivals []int) ([]IntervalRow, error) {
	m, err := NewMeter(rc, 0, nil)
	if err != nil {
		return nil, err
	}
	rows := make([]IntervalRow, 0, len(arrivals))
	for i, n := range arrivals {
		if n < 0 {
			return nil, fmt.Errorf("interval %d: arrivals must not be negative (got %d)", i+1, n)
		}
		start := int64(i) * m.sub
		row := IntervalRow{Interval: i + 1, Start: time.Duration(start), Arrived: n}
		refusedBefore := m.refused.Load()
		row.Released = m.Advance(start)
		for k := 0; k < n; k++ {
			// Arrivals are spread inside the sub-interval so waits can run out.
			at := start + int64(k)*(m.sub/int64(n+1))
			if at > start {
				row.Released += m.Advance(at)
			}
			if d := m.Admit(at, Normal); d.Verdict == Admit {
				row.Admitted++
			}
		}
		row.Refused = int(m.refused.Load() - refusedBefore)
		st := m.Status()
		row.Rate, row.Queued = st.Rate, st.Queued
		rows = append(rows, row)
	}
	return rows, nil
}

// BackendModel is a simulated backend for MOP: memory is base + bytes per
// session × live sessions, plus garbage that only a collection frees.
// Sessions live Lifetime, spread by Jitter. It is what `sluice simulate
// --mop` replays and what the MOP tests drive in fake time.
type BackendModel struct {
	// MaxBytes is the backend's maximum memory (its max heap), bytes.
	MaxBytes float64
	// BaseBytes is the memory used with no session live, bytes.
	BaseBytes float64
	// BytesPerSession is the memory one live session holds, bytes.
	BytesPerSession float64
	// Lifetime is how long a session lives after its admission.
	Lifetime time.Duration
	// Jitter spreads lifetimes uniformly over Lifetime × [1-Jitter,
	// 1+Jitter]; in [0,1). 0: every session lives exactly Lifetime.
	Jitter float64
	// LogSigma, when positive, draws lifetimes from a lognormal
	// distribution with median Lifetime and this σ (long-tailed; Jitter
	// is then ignored).
	LogSigma float64
	// LongShare of the sessions (in [0,1)) live LongLifetime instead of
	// Lifetime: a bimodal mix.
	LongShare    float64
	LongLifetime time.Duration
	// BytesSpread (0, or in [1,100]), when over 1, draws each session's memory uniformly
	// from BytesPerSession × [2/(1+s), 2s/(1+s)]: the largest session
	// holds s times the smallest, the mean stays BytesPerSession.
	BytesSpread float64
	// GarbagePerSession is memory a session leaves behind at admission
	// that only a collection frees, bytes. With GCEvery it makes the
	// sawtooth of a garbage-collected heap (a JVM's used heap).
	GarbagePerSession float64
	// GCEvery is the period of collections; 0 frees garbage at once.
	GCEvery time.Duration
	// ProbeLag makes the probe report the memory of this many probe
	// intervals before.
	ProbeLag int
	// Noise is uniform measurement noise of the probe, ± this fraction of
	// MaxBytes.
	Noise float64
	// Seed seeds lifetimes and noise; runs with one seed are identical.
	Seed int64
}

// Validate reports the first field out of range.
func (b BackendModel) Validate() error {
	switch {
	case !(b.MaxBytes > 0):
		return fmt.Errorf("max heap must be positive (got %g)", b.MaxBytes)
	case b.BaseBytes < 0 || b.BaseBytes >= b.MaxBytes:
		return fmt.Errorf("base must be in [0, max heap) (got %g of %g)", b.BaseBytes, b.MaxBytes)
	case !(b.BytesPerSession > 0):
		return fmt.Errorf("bytes per session must be positive (got %g)", b.BytesPerSession)
	case b.Lifetime <= 0:
		return fmt.Errorf("lifetime must be positive (got %s)", b.Lifetime)
	case b.Jitter < 0 || b.Jitter >= 1:
		return fmt.Errorf("jitter must be in [0,1) (got %g)", b.Jitter)
	case b.GarbagePerSession < 0 || b.GCEvery < 0:
		return errors.New("garbage per session and gc period must not be negative")
	case b.LogSigma < 0 || b.LogSigma > 3:
		return fmt.Errorf("lognormal sigma must be in [0,3] (got %g)", b.LogSigma)
	case b.LongShare < 0 || b.LongShare >= 1 || (b.LongShare > 0 && b.LongLifetime <= 0):
		return fmt.Errorf("long-share must be in [0,1), and with a positive long lifetime (got %g, long %s)", b.LongShare, b.LongLifetime)
	case b.BytesSpread != 0 && (b.BytesSpread < 1 || b.BytesSpread > 100):
		return fmt.Errorf("spread of bytes per session must be 0 or in [1,100] (got %g)", b.BytesSpread)
	case b.ProbeLag < 0:
		return fmt.Errorf("probe lag must not be negative (got %d)", b.ProbeLag)
	case b.Noise < 0 || b.Noise >= 0.5:
		return fmt.Errorf("noise must be in [0, 0.5) (got %g)", b.Noise)
	}
	return nil
}

// SafeRate is the highest steady rate of new sessions per second whose
// memory peak stays at ceiling (a fraction of MaxBytes), ignoring noise.
func (b BackendModel) SafeRate(ceiling float64) float64 {
	perRate := b.BytesPerSession * b.MeanLifetime().Seconds()
	if b.GCEvery > 0 {
		perRate += b.GarbagePerSession * b.GCEvery.Seconds()
	}
	return (ceiling*b.MaxBytes - b.BaseBytes) / perRate
}

// MeanLifetime is the mean of the lifetime distribution.
func (b BackendModel) MeanLifetime() time.Duration {
	life := float64(b.Lifetime)
	if b.LogSigma > 0 {
		life *= math.Exp(b.LogSigma * b.LogSigma / 2)
	}
	if b.LongShare > 0 {
		life = (1-b.LongShare)*life + b.LongShare*float64(b.LongLifetime)
	}
	return time.Duration(life)
}

// maxLifetime is the longest lifetime the model draws (lognormal draws
// are cut at 4σ).
func (b BackendModel) maxLifetime() time.Duration {
	life := float64(b.Lifetime) * (1 + b.Jitter)
	if b.LogSigma > 0 {
		life = float64(b.Lifetime) * math.Exp(4*b.LogSigma)
	}
	return time.Duration(math.Max(life, float64(b.LongLifetime)))
}

// SimBackend is the state of a BackendModel as time moves in steps.
type SimBackend struct {
	model   BackendModel
	rng     *rand.Rand
	step    int64     // current step
	stepDur int64     // ns
	expire  []int     // sessions ending at each step, a ring indexed by step
	live    int       // sessions live
	expireB []float64 // bytes of the sessions ending at each step
	liveB   float64   // bytes of the sessions live
	garbage float64   // bytes
	nextGC  int64     // ns
	probes  []float64
	probeN  int
}

// NewSimBackend returns model's backend at time 0 with no session, moving
// in steps of step.
func NewSimBackend(model BackendModel, step time.Duration) (*SimBackend, error) {
	if err := model.Validate(); err != nil {
		return nil, err
	}
	if step <= 0 {
		return nil, errors.New("simulation step must be positive")
	}
	b := &SimBackend{model: model, rng: rand.New(rand.NewSource(model.Seed)), stepDur: int64(step),
		nextGC: int64(model.GCEvery), probes: make([]float64, model.ProbeLag+1)}
	b.sizeRing()
	return b, nil
}

// sizeRing makes the expiry ring long enough for the longest lifetime,
// keeping the sessions already scheduled.
func (b *SimBackend) sizeRing() {
	need := int(float64(b.model.maxLifetime())/float64(b.stepDur)) + 2
	if need <= len(b.expire) {
		return
	}
	ring := make([]int, need)
	ringB := make([]float64, need)
	for i, n := range b.expire {
		// Entry i holds the sessions ending at the one step s in
		// (b.step, b.step+len] with s ≡ i modulo len.
		old := int64(len(b.expire))
		ahead := ((int64(i)-b.step)%old + old) % old
		if ahead == 0 {
			ahead = old
		}
		ring[(b.step+ahead)%int64(need)] += n
		ringB[(b.step+ahead)%int64(need)] += b.expireB[i]
	}
	b.expire, b.expireB = ring, ringB
}

// SetLifetime changes how long sessions admitted from now on live.
func (b *SimBackend) SetLifetime(d time.Duration) {
	b.model.Lifetime = d
	b.sizeRing()
}

// Advance moves one step on, in which admitted sessions started, and
// returns the used memory as a fraction of MaxBytes at its end.
func (b *SimBackend) Advance(admitted int) float64 {
	m := &b.model
	b.step++
	for k := 0; k < admitted; k++ {
		life := float64(m.Lifetime)
		switch {
		case m.LongShare > 0 && b.rng.Float64() < m.LongShare:
			life = float64(m.LongLifetime)
		case m.LogSigma > 0:
			life *= math.Exp(m.LogSigma * math.Max(-4, math.Min(4, b.rng.NormFloat64())))
		case m.Jitter > 0:
			life *= 1 - m.Jitter + 2*m.Jitter*b.rng.Float64()
		}
		bytes := m.BytesPerSession
		if sp := m.BytesSpread; sp > 1 {
			bytes *= (2 + 2*(sp-1)*b.rng.Float64()) / (1 + sp)
		}
		steps := max(1, int64(math.Round(life/float64(b.stepDur))))
		b.expire[(b.step+steps)%int64(len(b.expire))]++
		b.expireB[(b.step+steps)%int64(len(b.expire))] += bytes
		b.liveB += bytes
	}
	slot := b.step % int64(len(b.expire))
	b.live += admitted - b.expire[slot]
	b.liveB = math.Max(0, b.liveB-b.expireB[slot])
	b.expire[slot], b.expireB[slot] = 0, 0
	if m.GCEvery > 0 {
		b.garbage += float64(admitted) * m.GarbagePerSession
		if now := b.step * b.stepDur; now >= b.nextGC {
			b.garbage = 0
			b.nextGC += int64(m.GCEvery)
		}
	}
	return b.Used()
}

// Used is the memory in use now as a fraction of MaxBytes.
func (b *SimBackend) Used() float64 {
	m := &b.model
	return (m.BaseBytes + b.liveB + b.garbage) / m.MaxBytes
}

// SetBytesPerSession changes the memory of the sessions admitted from now
// on (a deploy); those live keep theirs.
func (b *SimBackend) SetBytesPerSession(bytes float64) { b.model.BytesPerSession = bytes }

// Probe is one reading of the backend's memory probe: used and max bytes,
// ProbeLag readings late and with the model's noise.
func (b *SimBackend) Probe() (used, maxBytes int64) {
	m := &b.model
	b.probes[b.probeN%len(b.probes)] = b.Used()
	b.probeN++
	frac := b.probes[b.probeN%len(b.probes)] // the oldest kept: ProbeLag readings ago
	if b.probeN < len(b.probes) {
		frac = b.probes[0]
	}
	if m.Noise > 0 {
		frac += m.Noise * (2*b.rng.Float64() - 1)
	}
	return int64(max(0, frac) * m.MaxBytes), int64(m.MaxBytes)
}

// MOPWindow is one averaging window of a MOP simulation.
type MOPWindow struct {
	Window   int           `json:"window"` // from 1
	End      time.Duration `json:"-"`
	EndSecs  float64       `json:"end_s"` // End in seconds
	Phase    MOPPhase      `json:"phase"`
	Allowed  float64       `json:"allowed_rate"` // per second, at the window's end
	Admitted int           `json:"admitted"`
	Refused  int           `json:"refused"`
	Memory   float64       `json:"memory"`      // used fraction at the window's end
	PeakMem  float64       `json:"peak_memory"` // highest used fraction in the window
	// The lifetime estimate at the window's end (MOPStatus); 0 while
	// nothing is estimated.
	Lifetime         time.Duration `json:"-"`
	LifetimeSecs     float64       `json:"lifetime_s"`      // median session lifetime, seconds
	LifetimeHighSecs float64       `json:"lifetime_high_s"` // 95th percentile, seconds
	BytesPerSession  float64       `json:"bytes_per_session"`
	Predicted        float64       `json:"predicted_memory"` // at the allowed rate, fraction of max
}

// MOPSim drives one MOP and one SimBackend in fake time: new work arrives
// evenly at a given rate, each request asks MOP.Allow, admitted ones start
// sessions, and the probe feeds MOP.Observe every ProbeEvery.
type MOPSim struct {
	MOP        *MOP
	Backend    *SimBackend
	Clock      ManualClock
	Step       time.Duration // default 10ms
	ProbeEvery time.Duration // default 1s
	// Misread, when set, changes the probe's n-th reading (from 0,
	// used/max) before MOP sees it: a probe gone wrong.
	Misread func(n int, frac float64) float64

	windows []MOPWindow
	cur     MOPWindow
	steps   int64
	carry   float64

	// Peak is the highest used fraction seen.
	Peak float64
	// Admitted and Refused count all new work since the start.
	Admitted, Refused int
	// RefusedLowMemory counts refusals while the backend's memory was
	// under half the ceiling: work refused for lack of discovery.
	RefusedLowMemory int
	// RefusedDiscovery counts refusals while MOP was in Discovery.
	RefusedDiscovery int
	// Allowed is the allowed rate at every probe, in order.
	Allowed []float64
	// Samples is the probe's reading at every probe (used/max, with the
	// model's lag and noise), in order: what MOP was shown.
	Samples []float64
	// MaxAllowedDiscovery is the highest allowed rate seen at a probe
	// while MOP was in Discovery.
	MaxAllowedDiscovery float64
}

// NewMOPSim returns a simulation of a new MOP with cfg in front of model.
func NewMOPSim(cfg MOPConfig, model BackendModel) (*MOPSim, error) {
	m, err := NewMOP(cfg)
	if err != nil {
		return nil, err
	}
	s := &MOPSim{MOP: m, Step: 10 * time.Millisecond, ProbeEvery: time.Second}
	if s.Backend, err = NewSimBackend(model, s.Step); err != nil {
		return nil, err
	}
	return s, nil
}

// Run offers rate new requests per second for d and returns every window
// that ended so far.
func (s *MOPSim) Run(rate float64, d time.Duration) []MOPWindow {
	step := int64(s.Step)
	probeSteps := max(1, int64(s.ProbeEvery)/step)
	winSteps := max(1, int64(s.MOP.cfg.Window)/step)
	half := s.MOP.cfg.MaxHeap / 2
	for n := int64(d) / step; n > 0; n-- {
		start := s.steps * step
		s.carry += rate * s.Step.Seconds()
		arrivals := int(s.carry)
		s.carry -= float64(arrivals)
		admitted := 0
		low := s.Backend.Used() < half
		discovering := MOPPhase(s.MOP.phase.Load()) == Discovery
		for k := 0; k < arrivals; k++ {
			// Arrivals are spread over the step, as they would be.
			s.Clock.Set(start + int64(k)*step/int64(arrivals))
			if s.MOP.Allow(s.Clock.Now()) {
				admitted++
				continue
			}
			s.Refused++
			s.cur.Refused++
			if low {
				s.RefusedLowMemory++
			}
			if discovering {
				s.RefusedDiscovery++
			}
		}
		s.steps++
		now := s.Clock.Advance(time.Duration(start + step - s.Clock.Now()))
		used := s.Backend.Advance(admitted)
		s.Admitted += admitted
		s.cur.Admitted += admitted
		s.Peak = max(s.Peak, used)
		s.cur.PeakMem = max(s.cur.PeakMem, used)
		if s.steps%probeSteps == 0 {
			u, m := s.Backend.Probe()
			if s.Misread != nil {
				u = int64(s.Misread(len(s.Samples), float64(u)/float64(m)) * float64(m))
			}
			s.MOP.Observe(now, u, m)
			s.Samples = append(s.Samples, float64(u)/float64(m))
			st := s.MOP.Status()
			s.Allowed = append(s.Allowed, st.AllowedRate)
			if st.Phase == Discovery {
				s.MaxAllowedDiscovery = max(s.MaxAllowedDiscovery, st.AllowedRate)
			}
		}
		if s.steps%winSteps == 0 {
			st := s.MOP.Status()
			s.cur.Window = len(s.windows) + 1
			s.cur.End = time.Duration(now)
			s.cur.EndSecs = s.cur.End.Seconds()
			s.cur.Phase, s.cur.Allowed, s.cur.Memory = st.Phase, st.AllowedRate, used
			s.cur.Lifetime, s.cur.LifetimeSecs, s.cur.LifetimeHighSecs = st.Lifetime, st.Lifetime.Seconds(), st.LifetimeHigh.Seconds()
			s.cur.BytesPerSession, s.cur.Predicted = st.BytesPerSession, st.PredictedMemory
			s.windows = append(s.windows, s.cur)
			s.cur = MOPWindow{}
		}
	}
	return s.windows
}

// Settled is how long after the start the allowed rate came within tol
// (0.10: 10%) of its last value and stayed there.
func (s *MOPSim) Settled(tol float64) time.Duration {
	if len(s.Allowed) == 0 {
		return 0
	}
	final := s.Allowed[len(s.Allowed)-1]
	i := len(s.Allowed)
	for i > 0 && math.Abs(s.Allowed[i-1]-final) <= tol*final {
		i--
	}
	return time.Duration(i) * s.ProbeEvery
}

// MOPSimSpec is what `sluice simulate --mop` replays: a backend model, the
// MOP settings in front of it, and the offered rate.
type MOPSimSpec struct {
	Model   BackendModel
	MOP     MOPConfig
	Rate    float64 // offered new work per second
	Windows int     // averaging windows to run
	// DeployAt, when positive, is when a deploy changes the memory of
	// the sessions started from then on to DeployBytes each.
	DeployAt    time.Duration
	DeployBytes float64
}

// MOPSimKeys documents the keys of ParseMOPSimSpec, for help texts.
const MOPSimKeys = `base=SIZE|PCT%   memory used with no session (bytes, or % of max-heap)     required
bytes=SIZE       memory one live session holds                             required
lifetime=DUR     how long a session lives                                  required
max-heap=SIZE    the backend's maximum memory                              required
rate=N           new sessions offered per second                           required
jitter=F         lifetimes spread over lifetime × [1-F, 1+F]               default 0
sigma=F          lognormal lifetimes: median lifetime, this σ              default 0
long=DUR         a second lifetime, lived by long-share of the sessions    default none
long-share=F     share of the sessions living long, in [0,1)               default 0
spread=F         bytes per session vary F× between sessions (mean bytes)   default 1
gc=DUR           collection period: garbage is freed only then             default none
garbage=SIZE     garbage a session leaves until the next collection        default 0
lag=N            the probe reports memory N probe intervals late           default 0
noise=F          probe noise, ± fraction of max-heap                       default 0
ceiling=F        MOP ceiling, fraction of max-heap (-mop-max-heap)         default 0.85
window=DUR       MOP averaging window (-mop-window)                        default 60s
initial=N        MOP rate before anything is learned (-mop-initial-rate)   default 10
windows=N        windows to run                                            default 6
seed=N           seed of jitter and noise                                  default 1
deploy=DUR       a deploy this long after the start                        default none
deploy-bytes=SIZE memory of a session started after the deploy             with deploy
SIZE is bytes with an optional unit (K, M, G, KiB, MiB, GiB, ...; powers of 1024).`

// ParseMOPSimSpec parses "base=100MiB,bytes=64KiB,lifetime=30s,
// max-heap=1GiB,rate=200" and the optional keys of MOPSimKeys. An error
// names the key at fault.
func ParseMOPSimSpec(spec string) (MOPSimSpec, error) {
	s := MOPSimSpec{Windows: 6, MOP: MOPConfig{Name: "simulated", Window: time.Minute}}
	s.Model.Seed = 1
	var basePct float64 = -1
	seen := map[string]bool{}
	for _, kv := range strings.Split(spec, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || v == "" {
			return s, fmt.Errorf("%q: want key=value", kv)
		}
		if seen[k] {
			return s, fmt.Errorf("%s: given twice", k)
		}
		seen[k] = true
		var err error
		switch k {
		case "base":
			if p, isPct := strings.CutSuffix(v, "%"); isPct {
				basePct, err = strconv.ParseFloat(strings.TrimSpace(p), 64)
				if err == nil && !(basePct >= 0 && basePct < 100) {
					err = errors.New("percentage must be in [0, 100)")
				}
			} else {
				s.Model.BaseBytes, err = parseSize(v)
			}
		case "bytes":
			s.Model.BytesPerSession, err = parseSize(v)
		case "lifetime":
			s.Model.Lifetime, err = time.ParseDuration(v)
		case "max-heap":
			s.Model.MaxBytes, err = parseSize(v)
		case "rate":
			s.Rate, err = parsePositive(v)
		case "jitter":
			s.Model.Jitter, err = strconv.ParseFloat(v, 64)
		case "sigma":
			s.Model.LogSigma, err = strconv.ParseFloat(v, 64)
		case "long":
			s.Model.LongLifetime, err = time.ParseDuration(v)
		case "long-share":
			s.Model.LongShare, err = strconv.ParseFloat(v, 64)
		case "spread":
			s.Model.BytesSpread, err = strconv.ParseFloat(v, 64)
		case "gc":
			s.Model.GCEvery, err = time.ParseDuration(v)
		case "garbage":
			s.Model.GarbagePerSession, err = parseSize(v)
		case "lag":
			s.Model.ProbeLag, err = strconv.Atoi(v)
		case "noise":
			s.Model.Noise, err = strconv.ParseFloat(v, 64)
		case "ceiling":
			s.MOP.MaxHeap, err = strconv.ParseFloat(v, 64)
		case "window":
			s.MOP.Window, err = time.ParseDuration(v)
		case "initial":
			s.MOP.InitialRate, err = parsePositive(v)
		case "windows":
			s.Windows, err = strconv.Atoi(v)
			if err == nil && (s.Windows < 1 || s.Windows > 1000) {
				err = errors.New("must be in [1, 1000]")
			}
		case "seed":
			s.Model.Seed, err = strconv.ParseInt(v, 10, 64)
		case "deploy":
			s.DeployAt, err = time.ParseDuration(v)
			if err == nil && s.DeployAt <= 0 {
				err = errors.New("want a positive duration")
			}
		case "deploy-bytes":
			s.DeployBytes, err = parseSize(v)
			if err == nil && !(s.DeployBytes > 0) {
				err = errors.New("want a positive size")
			}
		default:
			return s, fmt.Errorf("unknown key %q (want base, bytes, lifetime, max-heap, rate, jitter, sigma, long, long-share, spread, gc, garbage, lag, noise, ceiling, window, initial, windows, seed, deploy or deploy-bytes)", k)
		}
		if err != nil {
			return s, fmt.Errorf("%s=%s: %w", k, v, err)
		}
	}
	for _, k := range []string{"base", "bytes", "lifetime", "max-heap", "rate"} {
		if !seen[k] {
			return s, fmt.Errorf("%s is required", k)
		}
	}
	if seen["deploy"] != seen["deploy-bytes"] {
		return s, errors.New("deploy and deploy-bytes go together: when, and the bytes of a session after it")
	}
	if basePct >= 0 {
		s.Model.BaseBytes = basePct / 100 * s.Model.MaxBytes
	}
	if err := s.Model.Validate(); err != nil {
		return s, err
	}
	s.MOP.setDefaults()
	if err := s.MOP.Validate(); err != nil {
		return s, err
	}
	if s.Model.BaseBytes >= s.MOP.MaxHeap*s.Model.MaxBytes {
		return s, fmt.Errorf("base: %.0f bytes is already over the ceiling (%.0f of %.0f bytes)", s.Model.BaseBytes, s.MOP.MaxHeap*s.Model.MaxBytes, s.Model.MaxBytes)
	}
	if s.MOP.Window < 10*time.Millisecond || s.Model.Lifetime < 10*time.Millisecond || (s.Model.GCEvery > 0 && s.Model.GCEvery < 10*time.Millisecond) {
		return s, errors.New("window, lifetime and gc must be at least 10ms (the simulation step)")
	}
	if s.DeployAt >= time.Duration(s.Windows)*s.MOP.Window {
		return s, fmt.Errorf("deploy=%s: want a time within the run (%d windows of %s)", s.DeployAt, s.Windows, s.MOP.Window)
	}
	if steps := float64(s.Windows) * float64(s.MOP.Window) / float64(10*time.Millisecond); steps > 1e7 || s.Rate*s.MOP.Window.Seconds()*float64(s.Windows) > 1e8 {
		return s, errors.New("windows: the run is too long to simulate (over 10^7 steps or 10^8 requests)")
	}
	return s, nil
}

func parsePositive(v string) (float64, error) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f > 0) || math.IsInf(f, 0) {
		return 0, errors.New("want a positive number")
	}
	return f, nil
}

// parseSize reads bytes with an optional unit: K, M, G, T with or without
// "B" or "iB", all powers of 1024.
func parseSize(v string) (float64, error) {
	i := len(v)
	for i > 0 && (v[i-1] < '0' || v[i-1] > '9') && v[i-1] != '.' {
		i--
	}
	n, err := strconv.ParseFloat(strings.TrimSpace(v[:i]), 64)
	if err != nil || n < 0 || math.IsInf(n, 0) {
		return 0, errors.New("want a size in bytes, e.g. 64KiB")
	}
	unit := strings.ToLower(strings.TrimSpace(v[i:]))
	shift, ok := map[string]int{"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[strings.TrimSuffix(strings.TrimSuffix(unit, "b"), "i")]
	if !ok {
		return 0, fmt.Errorf("unknown unit %q (want K, M, G or T)", unit)
	}
	return n * float64(int64(1)<<shift), nil
}

// MOPSimReport is the outcome of a simulation.
type MOPSimReport struct {
	Spec             MOPSimSpec
	SafeRate         float64     // the model's highest safe steady rate at the ceiling
	Windows          []MOPWindow // one row per averaging window
	Peak             float64     // highest used fraction
	RefusedLowMemory int         // refused while memory was under half the ceiling
	Settled          time.Duration
	// SafeAfter is the safe rate after the deploy (0 without one).
	SafeAfter float64
	// Events are MOP's events with their time from the start, e.g. the
	// mop.estimate of a deploy.
	Events []string
}

// RunMOPSim replays spec in fake time.
func RunMOPSim(spec MOPSimSpec) (MOPSimReport, error) {
	var r MOPSimReport
	var sim *MOPSim
	cfg := spec.MOP
	cfg.Events = func(e Event) {
		if e.Kind == EventMOPEstimate || e.Kind == EventMOPPhase {
			r.Events = append(r.Events, fmt.Sprintf("%s %s: %s", time.Duration(sim.Clock.Now()).Round(time.Second), e.Kind, e.Message))
		}
	}
	sim, err := NewMOPSim(cfg, spec.Model)
	if err != nil {
		return MOPSimReport{}, err
	}
	total := time.Duration(spec.Windows) * sim.MOP.cfg.Window
	var rows []MOPWindow
	if spec.DeployAt > 0 {
		sim.Run(spec.Rate, spec.DeployAt)
		sim.Backend.SetBytesPerSession(spec.DeployBytes)
		after := spec.Model
		after.BytesPerSession = spec.DeployBytes
		r.SafeAfter = after.SafeRate(sim.MOP.cfg.MaxHeap)
		rows = sim.Run(spec.Rate, total-spec.DeployAt)
	} else {
		rows = sim.Run(spec.Rate, total)
	}
	r.Spec, r.SafeRate, r.Windows = spec, spec.Model.SafeRate(sim.MOP.cfg.MaxHeap), rows
	r.Peak, r.RefusedLowMemory, r.Settled = sim.Peak, sim.RefusedLowMemory, sim.Settled(0.10)
	return r, nil
}

// WriteTable prints the report: a header with the model, one row per window
// (allowed rate, admitted, refused, memory at the end and at its peak), and
// a summary.
func (r MOPSimReport) WriteTable(w io.Writer) error {
	m, c := r.Spec.Model, r.Spec.MOP
	fmt.Fprintf(w, "backend: base %.1f%%, %.0f bytes per session living %s (jitter %g), max heap %.0f bytes", 100*m.BaseBytes/m.MaxBytes, m.BytesPerSession, m.Lifetime, m.Jitter, m.MaxBytes)
	if m.GCEvery > 0 {
		fmt.Fprintf(w, ", %.0f bytes of garbage per session collected every %s", m.GarbagePerSession, m.GCEvery)
	}
	if r.Spec.DeployAt > 0 {
		fmt.Fprintf(w, "; a deploy at %s: %.0f bytes per session from then on", r.Spec.DeployAt, r.Spec.DeployBytes)
	}
	fmt.Fprintf(w, "\nmop: ceiling %.1f%%, window %s, initial rate %g/s; offered %g/s; safe rate at the ceiling %.1f/s", 100*c.MaxHeap, c.Window, c.InitialRate, r.Spec.Rate, r.SafeRate)
	if r.Spec.DeployAt > 0 {
		fmt.Fprintf(w, ", %.1f/s after the deploy", r.SafeAfter)
	}
	fmt.Fprint(w, "\n\n")
	tw := tabwriter.NewWriter(w, 2, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "window\tend\tphase\tallowed/s\tadmitted\trefused\tmemory\tpeak\tlifetime\tp95\tbytes/session\tpredicted\t")
	for _, row := range r.Windows {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%.1f\t%d\t%d\t%.1f%%\t%.1f%%\t", row.Window, row.End, row.Phase, row.Allowed, row.Admitted, row.Refused, 100*row.Memory, 100*row.PeakMem)
		if row.BytesPerSession > 0 {
			fmt.Fprintf(tw, "%.1fs\t%.1fs\t%.0f\t%.1f%%\t\n", row.LifetimeSecs, row.LifetimeHighSecs, row.BytesPerSession, 100*row.Predicted)
		} else {
			fmt.Fprint(tw, "-\t-\t-\t-\t\n")
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Events) > 0 {
		fmt.Fprintln(w)
	}
	for _, e := range r.Events {
		fmt.Fprintln(w, e)
	}
	// Past 100% the modelled backend would have run out of memory: say
	// so, a reader skimming the percentages may take it for the ceiling.
	over := ""
	if r.Peak >= 1 {
		over = ", over its max heap: the backend would have run out of memory"
	}
	_, err := fmt.Fprintf(w, "\npeak memory %.1f%% (ceiling %.1f%%%s); refused while memory was under half the ceiling: %d; allowed rate within 10%% of its last value after %s\n",
		100*r.Peak, 100*c.MaxHeap, over, r.RefusedLowMemory, r.Settled)
	return err
}
