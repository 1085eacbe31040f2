package cluster

import (
	"context"
	"encoding/json"
	"fmt"
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
	return max(1, int64(b.m.Status().AllowedRate))
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
	haveTot             bool
	leader              bool
	lastState           string
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
	if s.leader {
		if b, err := json.Marshal(s.m.Export()); err == nil {
			state = string(b)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, s.c.cfg.Timeout)
	defer cancel()
	ttl := 3 * s.c.cfg.Heartbeat.Milliseconds()
	res, err := mopSyncScript.Run(ctx, s.c.rdb, []string{s.key}, s.c.cfg.Node, ttl, da, dr, state).Slice()
	s.c.roundTrips.Add(1)
	if err != nil || len(res) != 4 {
		s.admitted.Add(da) // counted locally; Redis did not take them
		s.refused.Add(dr)
		s.c.roundTripFailed(err)
		return
	}
	s.c.fails.Store(0)
	s.syncs.Add(1)
	totA, _ := res[0].(int64)
	totR, _ := res[1].(int64)
	holder, _ := res[2].(string)
	st, _ := res[3].(string)
	if s.haveTot && totA >= s.lastTotA && totR >= s.lastTotR {
		s.admitted.Add(uint64(totA - s.lastTotA))
		s.refused.Add(uint64(totR - s.lastTotR))
	} else {
		// First sync, or Redis lost its totals: only our own delta is known.
		s.admitted.Add(da)
		s.refused.Add(dr)
	}
	s.lastTotA, s.lastTotR, s.haveTot = totA, totR, true
	s.leader = holder == s.c.cfg.Node
	s.m.SetFollower(!s.leader)
	if !s.leader && st != "" && st != s.lastState {
		var ms admission.MOPState
		if err := json.Unmarshal([]byte(st), &ms); err != nil {
			s.c.log.Warn("learned state of a backend in Redis is unreadable; keeping ours", "backend", s.id, "err", err)
		} else if err := s.m.Import(ms); err == nil {
			s.imports.Add(1)
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
