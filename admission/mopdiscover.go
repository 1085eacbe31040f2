package admission

// MOP's discovery: how the allowed rate grows from a cold start, bounded by
// what the memory samples prove safe (headroomBound) and by least-squares
// fits of memory against the admitted rate (fitBound). See mop.go for the
// limiter and the learned phase.

import (
	"math"
	"time"
)

// discoveryGrowth is how far above the demand seen in the last probe
// interval discovery sets the allowed rate, when the safe bound permits.
const discoveryGrowth = 2

// discover sets the allowed rate after a memory sample during discovery:
// the demand seen since the previous sample, doubled, but never more than
// the safe bound (see headroomBound), and never less than InitialRate.
func (m *MOP) discover(now int64, frac float64, admitted, refused uint64) {
	l := &m.l
	w := int64(m.cfg.Window)
	allowed := loadF(&m.allowed)
	if !l.midSet && now-l.winStart >= w/2 {
		l.midRate, l.midSet = allowed, true
	}
	if l.hist.n == 0 {
		return
	}
	prev := l.hist.at(0)
	dt := float64(now-prev.at) / float64(time.Second)
	if dt <= 0 {
		return
	}
	target := allowed
	if dRef := refused - prev.refused; dRef > 0 {
		demand := float64(admitted-prev.admitted+dRef) / dt
		target = math.Max(allowed, demand) * discoveryGrowth
	}
	// Each sample's bound holds on its own (it bounds bytes × lifetime
	// from that sample's memory and admitted rate), so the highest one
	// seen stands until memory passes the ceiling: a pause in traffic,
	// which drives the trailing admitted rate and so the latest bound to
	// zero, does not send discovery back to its start.
	bound := math.Max(l.headroom, l.proven)
	// Memory held now that the trailing admitted rate ρ does not explain
	// (sessions that affinity traffic keeps alive past a window, a base
	// that grew since a bound was proven) stays at any rate: at a steady
	// rate r memory is at most m + k × (r − ρ), where k is the memory per
	// unit of rate, so the rate may pass ρ only by the room left now. For
	// the proven bound k = ceiling / proven (the bytes × lifetime it
	// found); the cap lies between the latest bound and the proven one,
	// equals the proven one when memory fell with the rate (a pause), and
	// keeps a rate proven before long-lived sessions filled the backend
	// from being used on top of them. A fit is capped with its own slope.
	c := m.cfg.MaxHeap * (1 - m.cfg.Margin)
	if l.proven > 0 {
		bound = math.Min(bound, math.Max(0, l.rho+l.proven*(1-l.mem/c)))
	}
	if !m.cfg.windowOnly {
		// Sessions shorter than the window: the estimate of how long
		// they live bounds the rate over its own horizon, from the
		// memory now, so it grows at every plateau.
		bound = math.Max(bound, m.lifeBound(&l.rhoH, l.mem))
	}
	m.addFitPoints(now, admitted, frac)
	if f, _, slope := m.fitBound(now); f > bound {
		if slope > 0 {
			f = math.Min(f, l.rho+(c-l.mem)/slope)
		}
		// At most twice what the samples alone prove: a fit that went
		// wrong cannot run far ahead of the evidence.
		bound = math.Max(bound, math.Min(f, 2*bound))
	}
	if bound < target && l.midSet {
		l.capped = true
	}
	// One sample at most doubles the allowed rate, whatever it shows:
	// a made-up reading of almost no memory would otherwise open the
	// rate to the whole demand at once.
	next := math.Max(min(target, bound, discoveryGrowth*allowed), m.cfg.InitialRate)
	if math.Abs(next-allowed) > 0.005*allowed {
		m.setAllowed(next)
	}
}

// headroomBound is the highest rate that cannot take the backend's memory
// over the ceiling, from the samples so far and two assumptions: memory is
// base + bytes × live sessions with base >= 0, and a session lives at most
// one window (the operator's promise when choosing -mop-window).
//
// Then, for a session lifetime L <= W, memory now is m = base + bytes ×
// (admissions in the last L), so bytes × L <= m / ρ, where ρ is the lowest
// average admitted rate over any trailing span up to W; at a steady rate r
// memory is base + bytes × L × r <= m × r / ρ. The bound is therefore
// ceiling × ρ / m, less the margin. It needs no fit and holds at every
// sample, not only at the end of a window, so the rate may grow as soon as
// memory shows room: by a factor near ceiling/m while memory is low, and
// approaching the safe rate from below as memory nears the ceiling (memory
// at a rate above ρ is predicted as if all of it, base included, grew with
// the rate).
//
// m is the highest sample of the last quarter window, so that a heap that
// only shrinks at collections is judged by its peaks, and ρ is taken over
// spans ending now and at the previous sample, so that a probe reporting
// memory one interval late is still bounded.
func (m *MOP) headroomBound(now int64, admitted uint64, frac float64) (bound, rho float64) {
	h := &m.l.hist
	if h.n == 0 {
		return math.Inf(1), 0
	}
	horizon := int64(m.cfg.Window)
	mem := frac
	m.l.mem = frac
	rho = math.Inf(1)
	var riseSum, stepSum float64 // rises, and all changes, between consecutive samples of the last quarter window
	var rises, steps int
	for k := range m.l.rhoH {
		m.l.rhoH[k] = math.Inf(1)
	}
	low := frac // the lowest sample of the last window
	defer func() { m.l.lowMem = low }()
	ends := [2]mopSample{{at: now, admitted: admitted}, h.at(0)}
	for e, end := range ends {
		if e == 1 && h.n < 2 {
			break
		}
		whole := false // a span of at least the horizon was seen
		next := frac   // the sample after s
		longest := int64(0)
		for i := e; i < h.n && !whole; i++ {
			s := h.at(i)
			d := end.at - s.at
			if e == 0 {
				low = math.Min(low, s.mem)
			}
			if d > 0 {
				// The same over the lifetime estimate's horizons.
				avg := float64(end.admitted-s.admitted) / float64(d)
				for k := range m.l.rhoH {
					if d <= m.spans[k] {
						m.l.rhoH[k] = math.Min(m.l.rhoH[k], avg)
					}
				}
				longest = d
			}
			if e == 0 && d <= horizon/4 {
				mem = math.Max(mem, s.mem)
				stepSum += next - s.mem
				steps++
				if next > s.mem {
					riseSum += next - s.mem
					rises++
				}
				next = s.mem
			}
			if d <= 0 {
				continue
			}
			whole = d >= horizon
			rho = math.Min(rho, float64(end.admitted-s.admitted)/float64(d))
		}
		if !whole && h.n < len(h.s) {
			// Younger than the horizon: nothing was admitted before the
			// first sample but what the counters hold.
			rho = math.Min(rho, float64(end.admitted)/float64(horizon))
		}
		for k := range m.l.rhoH {
			if hk := m.spans[k]; longest < hk {
				if h.n < len(h.s) {
					m.l.rhoH[k] = math.Min(m.l.rhoH[k], float64(end.admitted)/float64(hk))
				} else {
					m.l.rhoH[k] = 0 // the history lost what a span this long needs
				}
			}
		}
	}
	for k := range m.l.rhoH {
		if math.IsInf(m.l.rhoH[k], 1) {
			m.l.rhoH[k] = 0
		} else {
			m.l.rhoH[k] *= float64(time.Second)
		}
	}
	if rises > 0 {
		// Memory may peak between samples, above the highest one, by
		// about what it rises in one interval beyond its trend: a
		// collected heap's highest point is just before a collection
		// nobody sampled.
		m.l.rise = math.Max(0, riseSum/float64(rises)-stepSum/float64(steps))
		mem += m.l.rise
	}
	if math.IsInf(rho, 1) || mem <= 0 {
		return math.Inf(1), 0
	}
	rho *= float64(time.Second)
	m.l.mem = mem
	return m.cfg.MaxHeap * (1 - m.cfg.Margin) * rho / mem, rho
}

// fitSpans are the candidate session lifetimes, in windows, of the fits:
// memory is base + slope × the admitted rate over the last lifetime.
// The longest, one and a half windows, lets the fits notice sessions that
// outlive the window.
var fitSpans = [...]float64{1. / 8, 1. / 4, 1. / 2, 1, 1.5}

// addFitPoints adds the sample to every fit: memory against the admitted
// rate over each span, ending now and ending at the previous sample (a
// probe one interval late).
func (m *MOP) addFitPoints(now int64, admitted uint64, frac float64) {
	l := &m.l
	h := &l.hist
	if h.n == 0 {
		return
	}
	ends := [2]mopSample{{at: now, admitted: admitted}, h.at(0)}
	for e, end := range ends {
		for k, span := range fitSpans {
			d := int64(span * float64(m.cfg.Window))
			before := h.countAt(end.at - d)
			l.fits[k][e].add(float64(end.admitted-before)*float64(time.Second)/float64(d), frac)
		}
	}
}

// countAt is the admitted count of the newest sample at or before t: 0
// when the history does not reach back that far and has lost nothing.
func (h *history) countAt(t int64) uint64 {
	for i := 0; i < h.n; i++ {
		if s := h.at(i); s.at <= t {
			return s.admitted
		}
	}
	if h.n == len(h.s) {
		return h.at(h.n - 1).admitted
	}
	return 0
}

// fitBound is the rate at which the fits (the most cautious of those with
// residuals near the smallest) predict the ceiling, less a margin that shrinks as
// the fit firms up: three standard errors of the prediction plus two of
// the residuals (noise, and a collected heap's sawtooth about its mean).
// It is 0 until the slope is known within 10%. It lets discovery close in
// on a high base faster than headroomBound, which counts the base as if it
// grew with the rate.
func (m *MOP) fitBound(now int64) (rate, base, slope float64) {
	if now-m.l.discStart < int64(m.cfg.Window) {
		// Until memory has been seen for a whole window, a short
		// lifetime fits as well as the true one and predicts too little
		// memory per rate: only headroomBound is safe then.
		return 0, 0, 0
	}
	type cand struct{ rate, base, slope, sd float64 }
	var cands [len(fitSpans) * 2]cand
	n, bestSD := 0, math.Inf(1)
	for k := range m.l.fits {
		for e := range m.l.fits[k] {
			if r, b, sl, sd, ok := m.fitRate(&m.l.fits[k][e]); ok {
				cands[n] = cand{r, b, sl, sd}
				n++
				bestSD = math.Min(bestSD, sd)
			}
		}
	}
	// Of the fits about as good as the best, trust the most cautious:
	// with a sawtooth or jitter several lifetimes fit alike, and the
	// shorter ones predict too little memory.
	rate = math.Inf(1)
	for _, c := range cands[:n] {
		if c.sd <= 1.5*bestSD && c.rate < rate {
			rate, base, slope = c.rate, c.base, c.slope
		}
	}
	if math.IsInf(rate, 1) {
		return 0, 0, 0
	}
	return rate, base, slope
}

// fitRate is the safe rate predicted by one fit and its residual standard
// deviation; ok is false while the fit cannot tell.
func (m *MOP) fitRate(f *fit) (rate, base, slope, sd float64, ok bool) {
	if f.n < 10 {
		return 0, 0, 0, 0, false
	}
	mx, my := f.sx/f.n, f.sy/f.n
	sxx := f.sxx - f.n*mx*mx
	sxy := f.sxy - f.n*mx*my
	syy := f.syy - f.n*my*my
	if sxx <= 0 {
		return 0, 0, 0, 0, false
	}
	slope = sxy / sxx
	if slope <= 0 {
		return 0, 0, 0, 0, false
	}
	base = my - slope*mx
	sd = math.Sqrt(math.Max(0, syy-slope*sxy) / (f.n - 2))
	if sd/math.Sqrt(sxx) > 0.1*slope {
		return 0, 0, 0, 0, false
	}
	room := m.cfg.MaxHeap*(1-m.cfg.Margin) - base - 2*sd
	r := room / slope
	for range 2 { // the prediction's error grows away from the mean rate
		se := sd * math.Sqrt(1/f.n+(r-mx)*(r-mx)/sxx)
		r = (room - 3*se) / slope
	}
	// A line is trusted at most twice past the highest rate it has seen.
	// The base returned is that of the line through the peaks.
	return math.Max(0, math.Min(r, 2*f.xmax)), base + 2*sd, slope, sd, true
}

// fit is a least-squares line through (rate, memory) points.
type fit struct {
	n, sx, sy, sxx, sxy, syy float64
	xmax                     float64
}

func (f *fit) add(x, y float64) {
	f.n++
	f.sx += x
	f.sy += y
	f.sxx += x * x
	f.sxy += x * y
	f.syy += y * y
	f.xmax = math.Max(f.xmax, x)
}

// line returns intercept and slope; ok is false while the rates seen are too
// alike to tell them apart.
func (f *fit) line() (base, slope float64, ok bool) {
	if f.n < 2 {
		return 0, 0, false
	}
	den := f.n*f.sxx - f.sx*f.sx
	mean := f.sx / f.n
	if den <= 1e-9*f.n*f.n*mean*mean || den == 0 {
		return 0, 0, false
	}
	slope = (f.n*f.sxy - f.sx*f.sy) / den
	base = (f.sy - slope*f.sx) / f.n
	return base, slope, true
}
