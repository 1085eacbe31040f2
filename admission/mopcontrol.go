package admission

import (
	"fmt"
	"math"
	"sync/atomic"
)

// Operator controls of a backend's MOP: Reset sends it back to discovery,
// Pin holds its rate by hand until Unpin or Reset.

// Reset forgets what the limiter learned: it starts discovery again at
// InitialRate, as a new backend does, and ends a pin. For a backend whose
// capacity changed (new hardware, a new release).
func (m *MOP) Reset() {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pinned.Store(0)
	m.l = learner{}
	m.phase.Store(uint32(Discovery))
	m.learned.Store(math.Float64bits(0))
	for _, a := range []*atomic.Uint64{&m.estMed, &m.estHigh, &m.estBytes, &m.estPerRate, &m.estBase} {
		a.Store(0) // the lifetime estimate too: the sessions may have changed
	}
	m.setAllowed(m.cfg.InitialRate)
	m.cfg.Events.emit(EventMOPPhase, m.cfg.Name, fmt.Sprintf("mop reset to discovery at %.1f/s", m.cfg.InitialRate))
}

// Pin holds the allowed rate at rate (requests per second, > 0): memory
// samples are still shown but nothing is learned until Unpin or Reset.
func (m *MOP) Pin(rate float64) error {
	if m == nil {
		return fmt.Errorf("backend has no memory probe, so no MOP rate to pin")
	}
	if !(rate > 0) || math.IsInf(rate, 0) {
		return fmt.Errorf("mop %s: pinned rate %v: want a number of requests per second > 0", m.cfg.Name, rate)
	}
	if rate < m.cfg.MinRate {
		return fmt.Errorf("mop %s: pinned rate %v is under the minimum rate %v (-mop-min-rate)", m.cfg.Name, rate, m.cfg.MinRate)
	}
	if rate > MaxMOPRate {
		return fmt.Errorf("mop %s: pinned rate %v is over the highest rate MOP allows, %v", m.cfg.Name, rate, float64(MaxMOPRate))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pinned.Load() == 0 {
		m.l.unpinned = loadF(&m.allowed)
	}
	m.setAllowed(rate)
	m.pinned.Store(math.Float64bits(rate))
	return nil
}

// Unpin ends a pin: the rate allowed before it is restored and learning
// resumes. It reports whether a pin was in force.
func (m *MOP) Unpin() bool {
	if m == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pinned.Load() == 0 {
		return false
	}
	m.pinned.Store(0)
	m.setAllowed(m.l.unpinned)
	return true
}

// Pinned returns the rate an operator pinned, or 0 while the limiter learns.
func (m *MOP) Pinned() float64 {
	if m == nil {
		return 0
	}
	return loadF(&m.pinned)
}
