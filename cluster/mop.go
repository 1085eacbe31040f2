package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// mopBudget leases a backend's allowed rate (per second) like an ARM rule.
type mopBudget struct {
	id string
	m  *admission.MOP
}

func (b mopBudget) Name() string { return b.id }
func (b mopBudget) limit(admission.MemState) int64 {
	return rateLimit(b.m.Status().AllowedRate)
}

// Bounds of what a backend's MOP may take from Redis.
const (
	// maxMOPRate is the highest rate per second a state from Redis may
	// hold, and the most a backend's leased budget allows: far above what
	// one backend takes as new work, far below where a float64 stops
	// converting to int64.
	maxMOPRate = 1e6
	// maxMOPState is the largest learned state read from Redis, in bytes
	// (an exported state is about 150, 220 sealed).
	maxMOPState = 4096
	// maxLockMS is the longest a learner lock may last: three of the
	// longest heartbeats (Config.Heartbeat is at most 10s). A lock further
	// ahead was not written by a node and is taken over.
	maxLockMS = 3 * 10 * 1000
)

// rateLimit converts an allowed rate to a lease limit in [1, maxMOPRate]:
// NaN, infinities and rates past int64 never reach the conversion (a rate
// of 9.3e18 converted to a negative limit and refused everything).
func rateLimit(rate float64) int64 {
	switch {
	case !(rate >= 1): // NaN too
		return 1
	case rate > maxMOPRate:
		return maxMOPRate
	}
	return int64(rate)
}

// checkMOPState decodes a learned state read from Redis and checks that a
// learner can have written it: a known phase, finite rates from 0 to
// maxMOPRate (a positive allowed rate, and a positive learned one when
// learned), a finite model whose safe rate (1 - base) / slope is at most
// maxMOPRate.
func checkMOPState(st string) (admission.MOPState, error) {
	var ms admission.MOPState
	if len(st) > maxMOPState {
		return ms, fmt.Errorf("%d bytes, more than %d", len(st), maxMOPState)
	}
	if err := json.Unmarshal([]byte(st), &ms); err != nil {
		return ms, err
	}
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case ms.Phase != admission.Discovery && ms.Phase != admission.Learned:
		return ms, fmt.Errorf("phase %d", ms.Phase)
	case !finite(ms.AllowedRate) || ms.AllowedRate <= 0 || ms.AllowedRate > maxMOPRate:
		return ms, fmt.Errorf("allowed rate %g not in (0, %g]", ms.AllowedRate, float64(maxMOPRate))
	case !finite(ms.LearnedRate) || ms.LearnedRate < 0 || ms.LearnedRate > maxMOPRate:
		return ms, fmt.Errorf("learned rate %g not in [0, %g]", ms.LearnedRate, float64(maxMOPRate))
	case ms.Phase == admission.Learned && ms.LearnedRate == 0:
		return ms, errors.New("learned without a learned rate")
	case !finite(ms.Base) || ms.Base < -1 || ms.Base > 1:
		return ms, fmt.Errorf("model base %g not in [-1, 1]", ms.Base)
	case !finite(ms.Slope) || ms.Slope < 0:
		return ms, fmt.Errorf("model slope %g", ms.Slope)
	case ms.Slope > 0 && (1-ms.Base)/ms.Slope > maxMOPRate:
		return ms, fmt.Errorf("model's safe rate %g over %g", (1-ms.Base)/ms.Slope, float64(maxMOPRate))
	}
	return ms, nil
}
func (b mopBudget) sub() time.Duration { return time.Second / 6 }
func (b mopBudget) queued() int64      { return 0 }
func (b mopBudget) windowRate() int64  { return 0 }
func (b mopBudget) advance(int64)      {}

// mopShare makes one backend's MOP cluster-wide: the node's admitted and
// refused new work goes into the cluster's totals; the node holding the
// backend's learner lock learns on those totals and publishes its state;
// the others follow it; all spend a budget leased from the allowed rate.
type mopShare struct {
	c     *Cluster
	id    string
	m     *admission.MOP
	lease *ruleLease
	key   string

	// Counts the learner sees: monotonic, the cluster's total while Redis
	// answers and this node's own while it does not.
	admitted, refused atomic.Uint64

	mu                  sync.Mutex // guards the fields below (sync loop)
	lastA, lastR        uint64     // local counts at the last sync
	lastTotA, lastTotR  int64      // cluster totals at the last sync
	lastSync            int64      // monotonic ns of the last sync
	lockUntil           int64      // expiry (Redis ms) of the learner lock this node holds; 0: none
	haveTot             bool
	leader              bool
	lastState           string
	lastHolder          string    // learner at the last sync
	lastImported        time.Time // UpdatedAt of the last state imported from lastHolder
	syncs, imports, pub atomic.Uint64
}

// AttachMOP shares backend id's MOP with the cluster (id must be the same
// on every node: the backend's address). Call it before Run or while
// running; DetachMOP undoes it.
func (c *Cluster) AttachMOP(id string, m *admission.MOP) {
	s := &mopShare{c: c, id: id, m: m, key: c.prefix[:len(c.prefix)-1] + ":mop:" + id + "}"}
	s.lease = newRuleLease(c, mopBudget{id: id, m: m}, "mopbudget")
	s.lease.l.SetMode(c.failMode(), c.nodes.Load())
	if c.Up() {
		s.lease.l.SetMode(admission.LeaseShared, 1)
	}
	a, r := m.LocalCounts()
	s.lastA, s.lastR = a, r
	s.admitted.Store(a)
	s.refused.Store(r)
	m.SetCountSource(func() (uint64, uint64) { return s.admitted.Load(), s.refused.Load() })
	m.SetLease(s.lease.l)
	m.SetFollower(false)
	c.mu.Lock()
	c.mops = append(c.mops, s)
	run := c.running
	c.mu.Unlock()
	if run != nil {
		run(s.lease)
	}
}

// DetachMOP returns backend id's MOP to standalone.
func (c *Cluster) DetachMOP(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, s := range c.mops {
		if s.id == id {
			s.m.SetLease(nil)
			s.m.SetCountSource(nil)
			s.m.SetFollower(false)
			s.lease.stop()
			c.mops = append(c.mops[:i], c.mops[i+1:]...)
			return
		}
	}
}

// sync makes the backend's round trip of one heartbeat period: counts in,
// totals and the learner's state out.
func (s *mopShare) sync(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, r := s.m.LocalCounts()
	da, dr := a-s.lastA, r-s.lastR
	s.lastA, s.lastR = a, r
	if !s.c.Up() {
		// Learn on our own counts meanwhile, from our last learned state.
		s.admitted.Add(da)
		s.refused.Add(dr)
		s.haveTot = false
		s.leader = false
		s.m.SetFollower(false)
		return
	}
	state := ""
	keys := s.c.stateKeys.Load()
	if s.leader {
		if b, err := json.Marshal(s.m.Export()); err == nil {
			state = string(b)
			if keys != nil {
				state = keys.seal(s.key, state)
			}
		}
	}
	ctx, cancel := context.WithTimeout(ctx, s.c.cfg.Timeout)
	defer cancel()
	ttl := 3 * s.c.cfg.Heartbeat.Milliseconds()
	res, err := mopSyncScript.Run(ctx, s.c.rdb, []string{s.key}, s.c.cfg.Node, ttl, da, dr, state, maxLockMS, maxMOPState, s.lockUntil).Slice()
	s.c.roundTrips.Add(1)
	var totA, totR int64
	var holder, st string
	if err == nil {
		var ok [8]bool
		if len(res) == 8 {
			totA, ok[0] = res[0].(int64)
			totR, ok[1] = res[1].(int64)
			holder, ok[2] = res[2].(string)
			st, ok[3] = res[3].(string)
			for i := 4; i < 8; i++ {
				_, ok[i] = res[i].(int64)
			}
		}
		if ok != [8]bool{true, true, true, true, true, true, true, true} {
			err = fmt.Errorf("MOP sync reply %v is not the script's", res)
			s.c.rejectf(rejectMOPState, 1, "MOP sync reply out of range; not used", "backend", s.id)
		}
	}
	if err != nil {
		s.admitted.Add(da) // counted locally; Redis did not take them
		s.refused.Add(dr)
		s.c.roundTripFailed(err)
		return
	}
	s.c.fails.Store(0)
	s.syncs.Add(1)
	if n := res[4].(int64); n > 0 {
		s.c.rejectf(rejectMOPCount, int(n), "a backend's admitted/refused total in Redis was not a count; restarted from 0", "backend", s.id)
	}
	if res[5].(int64) > 0 {
		s.c.rejectf(rejectMOPLock, 1, "a backend's learner lock in Redis was not a time, lay beyond the longest lock, named no node, or was taken from this node before it expired; taken over", "backend", s.id, "holder", holder)
	}
	if res[6].(int64) > 0 {
		s.c.rejectf(rejectMOPState, 1, "a backend's learned state in Redis was too big; deleted unread", "backend", s.id, "max_bytes", maxMOPState)
	}
	now := s.c.clock.Now()
	// Other nodes' admissions since the last sync: no more than the
	// highest rate allows in the time since, plus a second's burst.
	// Refusals are not bounded by a rate: 100 times that.
	bound := int64(maxMOPRate * (time.Duration(now-s.lastSync) + time.Second).Seconds())
	if !s.haveTot {
		bound = 0
	}
	switch {
	case s.haveTot && totA >= s.lastTotA+int64(da) && totR >= s.lastTotR+int64(dr) &&
		totA-s.lastTotA-int64(da) <= bound && totR-s.lastTotR-int64(dr) <= 100*bound:
		s.admitted.Add(uint64(totA - s.lastTotA))
		s.refused.Add(uint64(totR - s.lastTotR))
	default:
		if s.haveTot && (totA-s.lastTotA-int64(da) > bound || totR-s.lastTotR-int64(dr) > 100*bound) {
			s.c.rejectf(rejectMOPCount, 1, "a backend's admitted/refused totals in Redis jumped further than any backend admits; only this node's own counted",
				"backend", s.id, "admitted_jump", totA-s.lastTotA, "refused_jump", totR-s.lastTotR)
		}
		// First sync, or Redis lost (or was given) its totals: only our
		// own delta is known.
		s.admitted.Add(da)
		s.refused.Add(dr)
	}
	s.lastTotA, s.lastTotR, s.haveTot, s.lastSync = totA, totR, true, now
	s.leader = holder == s.c.cfg.Node
	s.lockUntil = 0
	if s.leader {
		s.lockUntil = res[7].(int64)
	}
	s.m.SetFollower(!s.leader)
	if holder != s.lastHolder {
		s.lastHolder, s.lastImported = holder, time.Time{} // another learner's clock
	}
	if !s.leader && st != "" && st != s.lastState {
		value, sealed := st, true
		if keys != nil {
			value, sealed = keys.open(s.key, st)
		}
		ms, err := checkMOPState(value)
		switch {
		case !sealed:
			s.c.rejectf(rejectMOPState, 1, "a backend's learned state in Redis is not sealed with the affinity key ring; keeping ours", "backend", s.id)
		case err != nil:
			s.c.rejectf(rejectMOPState, 1, "a backend's learned state in Redis is unreadable or out of range; keeping ours", "backend", s.id, "err", err)
		case !s.lastImported.IsZero() && !ms.UpdatedAt.After(s.lastImported):
			s.c.rejectf(rejectMOPState, 1, "a backend's learned state in Redis is older than the one imported last (replayed); keeping ours", "backend", s.id)
		default:
			if err := s.m.Import(ms); err == nil {
				s.imports.Add(1)
				s.lastImported = ms.UpdatedAt
			}
		}
	}
	if s.leader && state != "" {
		s.pub.Add(1)
	}
	s.lastState = st
}

// MOPStatus is one backend's sharing for /status.
type MOPStatus struct {
	Backend string `json:"backend"`
	Learner bool   `json:"learner"` // this node learns for the cluster
	Mode    string `json:"mode"`
	Tokens  int64  `json:"tokens"`
	Imports uint64 `json:"imports"` // learned states taken from the learner
}

func (s *mopShare) status() MOPStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return MOPStatus{Backend: s.id, Learner: s.leader, Mode: modeNames[s.lease.l.Mode()], Tokens: s.lease.l.Tokens(), Imports: s.imports.Load()}
}

func (s *mopShare) String() string { return fmt.Sprintf("mop %s", s.id) }
