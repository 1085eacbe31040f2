package admission

// Hooks through which a cluster shares one MOP per backend between nodes:
// one node learns on the cluster's total admitted work (SetCountSource) and
// the others follow its published rates (SetFollower, Import); every node
// spends a per-backend budget leased from the shared allowed rate
// (SetLease). A standalone node uses none of them.

// countSource returns new work admitted and refused since some start.
type countSource func() (admitted, refused uint64)

// LocalCounts returns the new work this node's MOP admitted and refused
// since start, whatever SetCountSource says: what a node adds to the
// cluster's total.
func (m *MOP) LocalCounts() (admitted, refused uint64) {
	return m.shards.granted(), m.shards.refused()
}

// SetCountSource makes the learner judge windows on the counts f returns
// (the cluster's total for this backend) instead of this node's own. nil
// restores the node's own counts. f is called under the learner's lock from
// Observe and must not block: return cached values.
func (m *MOP) SetCountSource(f func() (admitted, refused uint64)) {
	if f == nil {
		m.source.Store(nil)
		return
	}
	src := countSource(f)
	m.source.Store(&src)
}

// SetFollower turns learning off (on = true): Observe then only records the
// memory sample, and the allowed and learned rates come from Import of the
// learning node's Export.
func (m *MOP) SetFollower(on bool) { m.follower.Store(on) }

// Follower reports whether SetFollower(true) is in force.
func (m *MOP) Follower() bool { return m.follower.Load() }

// SetLease makes Allow also spend a token of l (in LeaseShared mode), so the
// cluster as a whole stays within the allowed rate; nil detaches it. In the
// other lease modes Allow is the node's own GCRA at the allowed rate divided
// as the mode says (LeaseLocal: ÷ divisor; LeaseOpen: full; LeaseClosed:
// nothing).
func (m *MOP) SetLease(l *Lease) { m.lease.Store(l) }

func (m *MOP) allowLeased(now int64, l *Lease) bool {
	l.note(Normal)
	switch l.mode.Load() {
	case LeaseOpen:
		return m.allowLocal(now, 1)
	case LeaseClosed:
		m.shards.pick().refused.Add(1)
		return false
	case LeaseLocal:
		return m.allowLocal(now, l.divisor.Load()) // the node's share of the allowed rate
	}
	gen, ok := l.take(now)
	if !ok && l.awaitRefill(now) {
		now = l.refreshed(now)
		gen, ok = l.take(now)
	}
	if !ok {
		m.shards.pick().refused.Add(1)
		return false
	}
	if !m.allowLocal(now, 1) {
		l.putBack(gen) // not spent
		return false
	}
	return true
}
