package admission

// MOP's lifetime estimate: how long a backend's sessions live and how much
// memory one holds, learned from how memory answers changes in the
// admitted rate. Memory is base + Σ_j w_j × A_j, where A_j is the work
// admitted in the last d_j (a grid of candidate lifetimes up to the
// window) and w_j ≥ 0 is the memory per session of the sessions that live
// about d_j: a step in the rate shows as a ramp that levels off after the
// lifetime, and the weights say where. A least-squares fit with
// non-negative weights (projected coordinate descent on accumulated
// normal equations: fixed arrays, no allocation) gives them at every
// sample. The estimate runs on the sample path only, never in Allow.

import (
	"fmt"
	"math"
	"time"
)

// lifeN is the number of candidate lifetimes: the window × 2^(-k/2),
// k = 0..lifeN-1 (for a 60 s window: 60, 42, 30, … 1.9 s).
const lifeN = 11

// lifeDims is the fit's size: the base and one weight per lifetime.
const lifeDims = lifeN + 1

// lifeRing is how many recent estimates the bound takes the most cautious of.
const lifeRing = 3

// lifeFit is one least-squares system memory ≈ base + Σ w_j A_j, kept as
// normal equations that forget with a half-life of two windows, so that a
// deploy (a new footprint per session) is learned anew.
type lifeFit struct {
	g   [lifeDims][lifeDims]float64 // Σ x xᵀ
	b   [lifeDims]float64           // Σ x y
	yy  float64                     // Σ y²
	n   float64                     // samples (decayed)
	w   [lifeDims]float64           // the solution: w[0] the base, w[j+1] the weight of lifetime j
	sse float64                     // residual sum of squares of w
	fit float64                     // the fit's memory at the latest sample
}

// lifeEstimate is what the learner knows of the sessions, in memory
// fractions and nanoseconds.
type lifeEstimate struct {
	ok       bool
	base     float64        // memory fraction at zero rate
	perSess  float64        // memory fraction one live session holds
	median   float64        // lifetime, ns, half the sessions live shorter
	high     float64        // lifetime, ns, 95% of the sessions live shorter
	q        [lifeN]float64 // memory a steady rate builds up within d_j, as a fraction of its plateau
	perRate  float64        // memory fraction per (session per second) at a steady rate
	exact    float64        // the same with each weight at its own lifetime (not the next longer one)
	fit      float64        // the fit's memory at the latest sample
	sd       float64        // residual standard deviation, memory fraction
	observed int64          // how long memory has been watched, ns
	weights  [lifeN]float64 // count-weighted share of sessions per lifetime
}

// lifeSpan is candidate lifetime j for window w, ns.
func lifeSpan(w int64, j int) int64 {
	return int64(float64(w) * math.Pow(2, -float64(j)/2))
}

func (f *lifeFit) add(x *[lifeDims]float64, y, decay float64) {
	for i := range lifeDims {
		f.b[i] = decay*f.b[i] + x[i]*y
		for k := range lifeDims {
			f.g[i][k] = decay*f.g[i][k] + x[i]*x[k]
		}
	}
	f.yy = decay*f.yy + y*y
	f.n = decay*f.n + 1
}

// solve runs projected coordinate descent from the previous solution
// (warm start): base and weights all ≥ 0.
func (f *lifeFit) solve() {
	for range 40 {
		for i := range lifeDims {
			if f.g[i][i] <= 0 {
				f.w[i] = 0
				continue
			}
			r := f.b[i]
			for k := range lifeDims {
				if k != i {
					r -= f.g[i][k] * f.w[k]
				}
			}
			f.w[i] = math.Max(0, r/f.g[i][i])
		}
	}
	// sse = yy − 2 wᵀb + wᵀGw
	sse := f.yy
	for i := range lifeDims {
		sse -= 2 * f.w[i] * f.b[i]
		for k := range lifeDims {
			sse += f.w[i] * f.g[i][k] * f.w[k]
		}
	}
	f.sse = math.Max(0, sse)
}

// addLifePoints adds the sample to the lifetime fits: memory against the
// work admitted over each candidate lifetime, ending now and ending at the
// previous sample (a probe one interval late), and re-solves them.
func (m *MOP) addLifePoints(now int64, admitted uint64, frac, maxBytes float64) {
	l := &m.l
	h := &l.hist
	if h.n == 0 {
		return
	}
	w := int64(m.cfg.Window)
	dt := float64(now - h.at(0).at)
	decay := math.Exp(-dt / float64(2*w) * math.Ln2)
	ends := [2]mopSample{{at: now, admitted: admitted}, h.at(0)}
	var xs [2][lifeDims]float64
	for e, end := range ends {
		x := &xs[e]
		x[0] = 1
		for j := range lifeN {
			x[j+1] = float64(end.admitted - h.countAt(end.at-m.spans[j]))
		}
	}
	m.detectShift(now, admitted, &xs[0], frac)
	if sh := &l.shift; sh.on && now-sh.at >= int64(m.cfg.Window) {
		// A window after the change every session of the old kind has
		// ended: the fits start again on samples of the new regime
		// only, from the old shape scaled, and take over.
		sh.on = false
		m.restartLife(sh.base)
		for k := range l.life {
			sh.warm(&l.life[k].w)
		}
	}
	l.shift.add(m, now, admitted, &xs[0], frac)
	for e := range ends {
		x := &xs[e]
		f := &l.life[e]
		f.add(x, frac, decay)
		if sh := &l.shift; sh.on {
			// After a change point the fit has few samples of the new
			// regime and, at a steady rate, cannot tell the lifetimes
			// apart: it starts from the old shape, scaled.
			sh.warm(&f.w)
		}
		f.solve()
		f.fit = 0
		for i := range lifeDims {
			f.fit += f.w[i] * x[i]
		}
	}
	l.est = m.lifeEstimate(now)
	if sh := &l.shift; sh.on {
		// Until the fits have watched the new regime for a window,
		// the estimate is the one before the change with every
		// session's memory scaled as the change point says.
		l.est = sh.estimate(now)
	}
	// The bound trusts the most cautious of the last few estimates:
	// one sample's fit may be thrown by a collection or noise.
	l.exactRing[l.exactN%len(l.exactRing)] = l.est.exact
	l.exactN++
	l.exactMax = 0
	for _, x := range l.exactRing {
		if !(x > 0) {
			l.exactMax = 0 // an estimate missing lately: none
			break
		}
		l.exactMax = math.Max(l.exactMax, x)
	}
	m.publishEstimate(now, maxBytes)
}

// A change point: when the fit misses shiftRun samples in a row by more
// than shiftSD residual deviations (and by more than shiftMin of memory),
// all the same way, once it has a window of data (and 1½ times the p95
// lifetime) and at most once in two windows, the backend changed (a deploy: a new footprint per session).
// At a steady rate a fit that forgets slowly explains the new level by
// moving the base, and shows bytes per session that are far off for two
// windows. Instead the ramp after the change (sessions of the new kind
// replacing the old ones within a lifetime) is measured against the old
// fit (lifeShift), and the fits forget what came before the change and
// keep the base they had (a pseudo-observation worth shiftPrior
// samples), so the new level is put on the sessions, where a deploy puts
// it.
const (
	shiftSD    = 4
	shiftMin   = 0.02
	shiftRun   = 3
	shiftKeep  = 0.01
	shiftPrior = 20
	// shiftDeep is the largest factor on a session's memory that a
	// change point's cut follows under the cut floor (to 1/shiftDeep of
	// the window's starting rate). Beyond it the change point is taken
	// to misread (a probe gone wrong; sessions that outgrew the window,
	// read ×24 by TestMOPLifetimeDoubles) and the cut floor holds.
	shiftDeep = 4
)

// detectShift compares the sample with what the fit ending now predicts
// from its weights before the sample, and restarts the fits at a change
// point.
func (m *MOP) detectShift(now int64, admitted uint64, x *[lifeDims]float64, frac float64) {
	l := &m.l
	e := &l.est
	// The fit must have seen its sessions' ramps level off: a window,
	// and 1½ times their 95th percentile lifetime.
	watched := max(int64(m.cfg.Window), int64(1.5*e.high))
	if !e.ok || now-m.lifeFrom() < watched || (l.shift.at > 0 && now-l.shift.at < 2*int64(m.cfg.Window)) {
		l.shiftRun = 0
		return
	}
	f := &l.life[0]
	pred := 0.0
	for i := range lifeDims {
		pred += f.w[i] * x[i]
	}
	r := frac - pred
	if math.Abs(r) <= math.Max(shiftSD*e.sd, shiftMin) {
		l.shiftRun = 0
		m.rampUndo()
		return
	}
	sign := math.Copysign(1, r)
	if l.shiftRun > 0 && sign != l.shiftSign {
		l.shiftRun = 0
		m.rampUndo()
	}
	l.shiftSign = sign
	l.shiftRun++
	if sign > 0 {
		m.rampCut(now, admitted, x, r, frac)
	}
	if l.shiftRun < shiftRun {
		return
	}
	l.shiftRun = 0
	l.rampAt = 0 // the change point confirms a ramp cut
	l.shift.start(m, now, e, &l.life[0].w)
	l.shift.base = math.Min(e.base, l.lowMem)
	m.restartLife(l.shift.base)
	// The samples that showed the change (this one and the shiftRun-1
	// before it, which history holds) are all there is of the new
	// regime: a plateau is judged from them as from a cold start.
	l.lifeStart = now
	if l.hist.n >= shiftRun-1 {
		l.lifeStart = l.hist.at(shiftRun - 2).at
	}
}

// rampCut: in the Learned phase, a sample that misses the fit upward by
// more than a change point's threshold, so far that one more probe
// interval of the same ramp takes memory over the ceiling, cuts the rate
// at once, before the change point (shiftRun samples) can confirm it: a
// deploy that doubles the memory of a session at a rate near the safe
// one raises memory by r × b a second (2.4 points a second for 30 s
// sessions at 396/s), and the second sample after it is already 2.3
// points over the ceiling. The miss r is read as the ramp of a change
// at the previous sample: sessions admitted since hold 1 + δ times the
// memory the fit gives them, δ = r / z (z: their memory by the fit). The
// sessions admitted before the change still hold memory for up to a
// lifetime, so the rate first goes where memory stops rising, ρ / (1 +
// δ) (ρ: the rate the old sessions end at, the lower of the trailing
// admitted rates), and as soon as memory is under the ceiling and no
// longer rising (rampRecover) to the plateau's safe rate, the estimate's
// with each session's memory × (1 + δ), as estimateCut has it after a
// change point; both less the margin and never under cutFloor: one
// sample at most halves the rate in a window. The cut is provisional,
// and it is undone when the next sample fits again (rampUndo). For 2 s
// sessions whose memory doubles (TestMOPDeploy) the drain first took the
// peak from 1.121 to 0.964, the least any learner can do
// (TestMOPDeployTwin); the rate a window later is 171/s against a safe
// 193/s (181/s before; the plateau's rate at once, without the drain:
// 187/s, but a peak of 1.064).
func (m *MOP) rampCut(now int64, admitted uint64, x *[lifeDims]float64, r, frac float64) {
	l := &m.l
	h := &l.hist
	if MOPPhase(m.phase.Load()) != Learned || m.cfg.windowOnly || m.cfg.doubling || l.rampAt != 0 || frac+r <= m.cfg.MaxHeap || h.n == 0 {
		return
	}
	prev := h.at(0)
	dt := float64(now-prev.at) / float64(time.Second)
	if dt <= 0 || admitted <= prev.admitted {
		return
	}
	n := float64(admitted - prev.admitted)
	w := &l.life[0].w
	z := 0.0
	for j := range lifeN {
		z += w[j+1] * math.Min(x[j+1], n)
	}
	if !(z > 0) {
		return
	}
	k := l.exactMax
	base := math.Min(l.est.base, l.lowMem)
	if !(k > 0) || base >= m.cfg.MaxHeap {
		return
	}
	delta := math.Min(99, r/z)
	allowed := loadF(&m.allowed)
	floor := m.cutFloor()
	plateau := math.Max((m.cfg.MaxHeap-base)/(k*(1+delta))*(1-m.cfg.Margin), floor)
	rho := math.Min(n/dt, l.rho)
	next := math.Max(math.Min(rho/(1+delta)*(1-m.cfg.Margin), plateau), floor)
	if next >= allowed {
		return
	}
	m.markProvisional(now)
	m.setAllowed(next)
	l.rampAt, l.rampFrom, l.rampRate = now, allowed, loadF(&m.allowed)
	l.rampUp = plateau
	m.learn(loadF(&m.allowed), fmt.Sprintf("memory at %.1f%% ramps %.1f points a sample over the fit", 100*frac, 100*r))
}

// rampRecover raises the rate a ramp cut set to the plateau's safe rate
// once memory is under the ceiling and not rising beyond the noise, when
// nothing else has moved the rate since.
func (m *MOP) rampRecover(frac float64) {
	l := &m.l
	h := &l.hist
	if l.rampUp == 0 || h.n == 0 {
		return
	}
	if allowed := loadF(&m.allowed); allowed != l.rampRate || l.rampUp <= allowed {
		l.rampUp = 0
		return
	}
	if frac > m.cfg.MaxHeap || frac-h.at(0).mem > 3*l.est.sd {
		return
	}
	up := l.rampUp
	l.rampUp = 0
	m.setAllowed(up)
	l.rampRate = loadF(&m.allowed)
	m.learn(l.rampRate, fmt.Sprintf("memory at %.1f%% stopped rising after the ramp cut", 100*frac))
}

// rampUndo restores the rate a ramp cut lowered when the next sample fits
// again and nothing has moved the rate since: one sample was all there
// was.
func (m *MOP) rampUndo() {
	l := &m.l
	if l.rampAt == 0 {
		return
	}
	l.rampAt, l.rampUp = 0, 0
	if loadF(&m.allowed) == l.rampRate && !l.crossed {
		m.setAllowed(l.rampFrom)
		m.learn(loadF(&m.allowed), "memory fits again after one sample over the fit")
	}
}

// lifeShift carries the estimate across a change point: the fit of the
// regime before it, frozen, and one term more, the factor 1+δ on the
// memory of each session admitted since. Sessions of the new kind replace
// the old ones within their lifetime, so the residuals of the old fit
// ramp up (or down) along z(t) = Σ_j w_j × (work admitted in the last d_j
// and since the change), with the old weights w_j; δ is the least-squares
// factor of that ramp, Σ r z / Σ z². It needs no change in the rate: a
// deploy at a steady rate is measured by the ramp it causes.
type lifeShift struct {
	on       bool
	at       int64             // the change point (the first sample that showed it)
	admitted uint64            // admitted count at the change point
	pre      lifeEstimate      // the estimate before it
	w        [lifeDims]float64 // the fit before it (base, weights)
	rz, zz   float64           // Σ r z, Σ z²
	rr       float64           // Σ r², for the residuals after the change
	base     float64           // the base the fits hold after it
	n        float64
	delta    float64
}

// start freezes the estimate e and the weights w at a change point.
func (s *lifeShift) start(m *MOP, now int64, e *lifeEstimate, w *[lifeDims]float64) {
	h := &m.l.hist
	*s = lifeShift{on: true, at: now, pre: *e, w: *w, base: s.base}
	// The change shows from the first of the samples that missed.
	if h.n >= shiftRun-1 {
		p := h.at(shiftRun - 2)
		s.at, s.admitted = p.at, p.admitted
	}
	if h.n >= shiftRun {
		s.admitted = h.at(shiftRun - 1).admitted
	}
}

// add adds the sample (x: work admitted over each candidate lifetime,
// ending now) to the change-point term.
func (s *lifeShift) add(m *MOP, now int64, admitted uint64, x *[lifeDims]float64, frac float64) {
	if !s.on || now < s.at {
		return
	}
	h := &m.l.hist
	pred, z := s.w[0], 0.0
	for j := range lifeN {
		pred += s.w[j+1] * x[j+1]
		from := max(h.countAt(now-m.spans[j]), s.admitted)
		if admitted > from {
			z += s.w[j+1] * float64(admitted-from)
		}
	}
	r := frac - pred
	s.rz += r * z
	s.zz += z * z
	s.rr += r * r
	s.n++
	if s.zz > 0 {
		// A session of the new kind holds between a tenth and a hundred
		// times the memory of the old: samples that say otherwise (a
		// probe gone wrong) move the estimate no further.
		s.delta = max(-0.9, min(99, s.rz/s.zz))
	}
}

// warm sets w to the fit before the change with each weight scaled by 1+δ.
func (s *lifeShift) warm(w *[lifeDims]float64) {
	w[0] = s.w[0]
	for j := 1; j < lifeDims; j++ {
		w[j] = s.w[j] * (1 + s.delta)
	}
}

// estimate is the estimate before the change with each session's memory
// scaled by 1+δ.
func (s *lifeShift) estimate(now int64) lifeEstimate {
	e := s.pre
	k := 1 + s.delta
	e.perSess *= k
	e.perRate *= k
	e.exact *= k
	e.observed += now - s.at
	if s.n > 1 && s.zz > 0 {
		// The residual deviation after the change, of the scaled fit.
		e.sd = math.Max(e.sd, math.Sqrt(math.Max(0, s.rr-s.rz*s.rz/s.zz)/(s.n-1)))
	}
	return e
}

// restartLife has the lifetime fits forget what they saw (all but
// shiftKeep of it) and hold the base at base, with the weight of
// shiftPrior samples.
func (m *MOP) restartLife(base float64) {
	for k := range m.l.life {
		f := &m.l.life[k]
		for i := range lifeDims {
			f.b[i] *= shiftKeep
			for j := range lifeDims {
				f.g[i][j] *= shiftKeep
			}
		}
		f.yy *= shiftKeep
		f.n *= shiftKeep
		f.g[0][0] += shiftPrior
		f.b[0] += shiftPrior * base
		f.yy += shiftPrior * base * base
	}
}

// lifeFrom is when the data of the lifetime fits begins: discovery's
// start, or the last change point.
func (m *MOP) lifeFrom() int64 {
	return max(m.l.discStart, m.l.lifeStart)
}

// Regime changes: an estimate at least regimeFactor away from the one of
// the last regime, in bytes per session or in median lifetime, for
// regimeSamples samples in a row, once memory has been watched for a
// window, is a new regime (a deploy): an EventMOPEstimate is written.
const (
	regimeFactor  = 1.5
	regimeSamples = 5
)

// publishEstimate makes the estimate visible in Status and writes an
// event when it changes regime.
func (m *MOP) publishEstimate(now int64, maxBytes float64) {
	l := &m.l
	e := &l.est
	if !e.ok {
		return
	}
	m.estMed.Store(math.Float64bits(e.median))
	m.estHigh.Store(math.Float64bits(e.high))
	m.estBytes.Store(math.Float64bits(e.perSess * maxBytes))
	m.estPerRate.Store(math.Float64bits(e.exact))
	m.estBase.Store(math.Float64bits(e.base))
	if now-l.discStart < int64(m.cfg.Window) {
		return
	}
	far := func(a, b float64) bool { return a > regimeFactor*b || b > regimeFactor*a }
	switch {
	case l.regimeBytes == 0:
		l.regimeBytes, l.regimeLife = e.perSess, e.median
	case far(e.perSess, l.regimeBytes) || far(e.median, l.regimeLife):
		l.regimeRun++
		if l.regimeRun >= regimeSamples {
			m.cfg.Events.emit(EventMOPEstimate, m.cfg.Name, fmt.Sprintf("sessions changed: %.0f -> %.0f bytes each, median lifetime %s -> %s",
				l.regimeBytes*maxBytes, e.perSess*maxBytes, time.Duration(l.regimeLife).Round(time.Millisecond), time.Duration(e.median).Round(time.Millisecond)))
			l.regimeBytes, l.regimeLife, l.regimeRun = e.perSess, e.median, 0
		}
	default:
		l.regimeRun = 0
	}
}

// lifeEstimate reads the fits: of the two (now, one sample late), the one
// with the smaller residuals, unless the other fits about as well and is
// more cautious (more memory per unit of rate). Weights at lifetimes not
// yet watched for twice their length (the ramp may not have levelled off)
// count as sessions that live the whole window.
func (m *MOP) lifeEstimate(now int64) lifeEstimate {
	l := &m.l
	w := int64(m.cfg.Window)
	obs := now - m.lifeFrom()
	var best lifeEstimate
	bestSD := math.Inf(1)
	for e := range l.life {
		f := &l.life[e]
		if f.n < 2.5 { // three samples, decayed
			continue
		}
		var est lifeEstimate
		est.observed = obs
		est.sd = math.Sqrt(f.sse / math.Max(1, f.n-float64(lifeDims)))
		est.base = f.w[0]
		est.fit = f.fit
		total, mem, exact := 0.0, 0.0, 0.0
		var life, lifeOwn [lifeN]float64
		for j := range lifeN {
			// Each weight counts as the next longer candidate: a
			// lifetime between two candidates, or noise, splits its
			// weight between them, and the shorter would promise too
			// little memory.
			d, own := m.spans[max(0, j-1)], float64(m.spans[j])
			life[j] = float64(d)
			if 3*m.spans[j] > 2*obs {
				// Not watched for 1½ times its length, so not seen
				// to level off: as long as the window allows.
				life[j], own = float64(w), float64(w)
			}
			lifeOwn[j] = own
			total += f.w[j+1]
			mem += f.w[j+1] * life[j]
			exact += f.w[j+1] * own
		}
		if !(total > 0) || !(mem > 0) {
			continue
		}
		est.ok = true
		est.perSess = total
		est.perRate = mem / float64(time.Second)
		est.exact = exact / float64(time.Second)
		for k := range lifeN {
			hk := float64(m.spans[k])
			built := 0.0
			for j := range lifeN {
				built += f.w[j+1] * math.Min(life[j], hk)
			}
			est.q[k] = built / mem
		}
		// Count-weighted lifetime percentiles, shortest first.
		cum := 0.0
		for j := lifeN - 1; j >= 0; j-- {
			est.weights[j] = f.w[j+1] / total
			prev := cum
			cum += est.weights[j]
			if prev < 0.5 && cum >= 0.5 {
				est.median = lifeOwn[j]
			}
			if prev < 0.95 && cum >= 0.95 {
				est.high = lifeOwn[j]
			}
		}
		if est.high == 0 {
			est.high = lifeOwn[0]
		}
		if est.median == 0 {
			est.median = est.high
		}
		switch {
		case est.sd < bestSD/1.5:
			best, bestSD = est, est.sd
		case est.sd <= 1.5*bestSD && est.perRate > best.perRate:
			best, bestSD = est, math.Min(bestSD, est.sd)
		}
	}
	return best
}

// lifeBound is the highest rate the lifetime estimate proves safe: for
// each candidate horizon H, memory now is at least base + (memory per
// unit of rate) × q(H) × ρ_H, where ρ_H is the lowest trailing admitted
// rate over spans up to H and q(H) the share of a steady rate's plateau
// built within H; so a steady rate r holds memory at most m × r /
// (ρ_H × q(H)). The bound is the best horizon's ceiling × ρ_H × q(H) / m,
// less a margin that shrinks as the estimate firms up (with the time
// memory has been watched and with the fit's residuals). 0 when nothing
// is estimated.
func (m *MOP) lifeBound(rhoH *[lifeN]float64, mem float64) float64 {
	est := &m.l.est
	if !est.ok || mem <= 0 || mem-est.base < 4*est.sd {
		return 0 // the sessions' memory is not yet clear of the noise
	}
	u := m.cfg.Margin + math.Min(0.3, 0.5*est.high/math.Max(1, float64(est.observed)))
	u = math.Min(0.5, u+2*est.sd/mem)
	best := 0.0
	for k := range lifeN {
		if rhoH[k] > 0 && !math.IsInf(rhoH[k], 1) {
			best = math.Max(best, rhoH[k]*est.q[k])
		}
	}
	bound := m.cfg.MaxHeap * (1 - u) * best / mem
	// The plateau the estimate predicts at a steady rate r is base + r ×
	// (memory per unit of rate): the rate whose plateau stays under the
	// ceiling less the margin. The base is at most the lowest memory
	// seen lately (sessions cannot hold less than nothing).
	// Memory peaks above the fit (a collected heap's sawtooth, noise)
	// by as much as the recent peak exceeds the fit now, and by three
	// residual deviations.
	base := math.Min(est.base, m.l.lowMem)
	over := math.Max(0, mem-est.fit) + 3*est.sd
	if k := m.l.exactMax; k > 0 {
		abs := (m.cfg.MaxHeap*(1-u) - base - over) / k
		// And memory grows from what it holds now by k per unit of
		// rate above the rate admitted over the sessions' lifetime ρ*:
		// the room left now bounds the step, whatever the base.
		rho := 0.0
		for j := lifeN - 1; j >= 0; j-- {
			if float64(m.spans[j]) >= 1.38*est.high { // the next longer candidate, as the weights count
				rho = rhoH[j]
				break
			}
		}
		room := rho + (m.cfg.MaxHeap*(1-u)-mem-2*est.sd)/k
		bound = math.Max(bound, math.Min(abs, room))
	}
	return bound
}

// estimateCut lowers the allowed rate at once when the lifetime estimate,
// watched for a window, predicts in discovery (in the Learned phase:
// once after a change point) a
// plateau over the ceiling at it: base + allowed × (memory per unit of
// rate) > ceiling. Memory answers the rate only a lifetime later, so by
// the time it passes the ceiling the sessions admitted meanwhile are
// still alive and push it further: a deploy that doubles the memory of a
// session is cut when the estimate sees it, not when memory does. The
// rate goes to the estimate's safe rate (ceiling less the margin, as
// safeRate), never under cutFloor, and the estimate becomes the model the
// Learned phase adapts when there is none yet. The estimate stands on many samples, so the cut is
// not provisional.
func (m *MOP) estimateCut(now int64, frac float64) {
	l := &m.l
	e := &l.est
	k := l.exactMax
	if MOPPhase(m.phase.Load()) != Discovery && (!l.shift.on || l.shiftCut == l.shift.at) {
		return // the Learned phase adapts its own model (judgeWindow), once cut after a change point
	}
	if m.cfg.windowOnly || m.cfg.doubling || !e.ok || !(k > 0) || e.observed < int64(m.cfg.Window) || frac-e.base < 4*e.sd {
		return
	}
	base := math.Min(e.base, l.lowMem)
	allowed := loadF(&m.allowed)
	if base >= m.cfg.MaxHeap || base+allowed*k <= m.cfg.MaxHeap {
		return
	}
	floor := m.cutFloor()
	if l.shift.on && 1+l.shift.delta <= shiftDeep {
		// A change point stands on shiftRun samples, and its factor
		// on the memory of a session is measured: the rate may go
		// under the cut floor, to a quarter of the window's starting
		// rate at most.
		floor = math.Min(floor, l.winAllowed/shiftDeep)
	}
	safe := math.Max((m.cfg.MaxHeap-base)/k*(1-m.cfg.Margin), floor)
	if safe >= allowed {
		return
	}
	if l.shift.on {
		l.shiftCut = l.shift.at
	}
	if cf := m.cutFloor(); safe < cf {
		l.deepFloor = cf // deepRecover may take the rate back up to it
	}
	if !l.haveModel {
		l.base, l.slope, l.haveModel = base, k, true
	}
	l.proven = 0
	m.setAllowed(safe)
	m.learn(safe, fmt.Sprintf("the estimate predicts %.1f%% memory at %.1f/s", 100*(base+allowed*k), allowed))
}

// deepRecover follows a change point's cut under the cut floor back up:
// three samples after a change, with noise or a late probe, the factor
// 1 + δ may be overstated (1.6 for a doubling with ±1% noise) and the
// cut too deep. Once memory is under the ceiling and not rising beyond
// the noise, the rate goes to the estimate's safe rate as it firms up,
// never above the cut floor the change point's cut went under, and
// never down.
func (m *MOP) deepRecover(frac float64) {
	l := &m.l
	e := &l.est
	h := &l.hist
	if l.deepFloor == 0 {
		return
	}
	allowed := loadF(&m.allowed)
	if !l.shift.on || allowed >= l.deepFloor {
		l.deepFloor = 0 // the new regime took over, or the rate is back
		return
	}
	k := l.exactMax
	if !(k > 0) || h.n == 0 || frac > m.cfg.MaxHeap || frac-h.at(0).mem > 3*e.sd {
		return
	}
	base := math.Min(e.base, l.lowMem)
	up := math.Min((m.cfg.MaxHeap-base)/k*(1-m.cfg.Margin), l.deepFloor)
	if up > allowed*1.005 {
		m.setAllowed(up)
		m.learn(loadF(&m.allowed), fmt.Sprintf("the estimate firms up at %.1f%% memory", 100*frac))
	}
}

// drainCut: while memory is over the ceiling and still rising, the
// sessions admitted before the last cut are alive for up to a lifetime
// more, so a rate sized for the plateau still lets memory grow. Over the
// last five samples memory rose by Δ while ρ sessions a second were
// admitted: sessions end at ρ − Δ/(s × t) a second (s: memory of one
// session), and the rate goes under that, less the margin, so that
// inflow is under outflow and memory falls. Never under the cut floor
// (half the window's starting rate, as cut) or MinRate: a lifetime that
// grew, rather than bytes, shows the same rise and is followed by the
// windows, not by one rise.
func (m *MOP) drainCut(now int64, frac float64) {
	l := &m.l
	e := &l.est
	h := &l.hist
	if m.cfg.windowOnly || m.cfg.doubling || !l.crossed || frac <= m.cfg.MaxHeap || !e.ok || !(e.perSess > 0) || h.n < 5 {
		return
	}
	p := h.at(4)
	dt := float64(now-p.at) / float64(time.Second)
	rise := frac - p.mem
	if dt <= 0 || rise <= 3*e.sd {
		return // not rising beyond the noise
	}
	admitted, _ := m.counts()
	rho := float64(admitted-p.admitted) / dt
	out := rho - rise/dt/e.perSess
	next := math.Max(math.Max(out*(1-m.cfg.Margin), m.cutFloor()), m.cfg.MinRate)
	if allowed := loadF(&m.allowed); next < allowed {
		m.setAllowed(next)
		m.learn(next, fmt.Sprintf("memory at %.1f%% still rising over the ceiling", 100*frac))
	}
}
