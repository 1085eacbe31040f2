package cluster

import (
	"sync/atomic"
	"time"
)

// Everything read from Redis is hostile input: any client of the cluster's
// Redis can write the keys, fields and channels the nodes use (see the
// README, "Trust"). What a node finds out of range is not used, never
// overwrites a sane local value, and is counted here by kind; a warning is
// logged at most once per rejectLogEvery and kind.

// Kinds of rejected Redis contents.
const (
	rejectLeaseField = iota // a rule's counter field that is not a count of a past or current sub-interval
	rejectLeaseReply        // a lease reply out of range
	rejectLeaseLost         // a rule's counter below this node's own count (flushed or lowered); restored
	rejectNodes             // a member count or member out of range
	rejectMOPLock           // a learner lock not a time, or further ahead than a lock can last
	rejectMOPCount          // a backend's admitted/refused total not a count, or a jump no backend can make
	rejectMOPState          // a learned state too big, unreadable or out of range
	rejectDialogSig         // a dialog change unsigned, with a bad signature or an unknown key
	rejectDialogBad         // a dialog change too big, replayed, stale or unreadable
	rejectDialogCap         // a dialog insert past Config.DialogMax
	rejectKinds
)

var rejectNames = [rejectKinds]string{"lease_field", "lease_reply", "lease_lost", "nodes", "mop_lock", "mop_count", "mop_state", "dialog_signature", "dialog_invalid", "dialog_cap"}

// rejectLogEvery rate-limits the warning of each kind.
const rejectLogEvery = 10 * time.Second

type rejects struct {
	now     func() int64 // wall ns for the log's rate limit; nil: time.Now (tests set it)
	n       [rejectKinds]atomic.Uint64
	lastLog [rejectKinds]atomic.Int64 // wall ns of the last warning
	logged  [rejectKinds]atomic.Uint64
}

// rejectf counts n rejected values of kind and logs msg with args, unless a
// warning of this kind was logged within rejectLogEvery.
func (c *Cluster) rejectf(kind, n int, msg string, args ...any) {
	total := c.rejected.n[kind].Add(uint64(n))
	now := time.Now().UnixNano()
	if c.rejected.now != nil {
		now = c.rejected.now()
	}
	last := c.rejected.lastLog[kind].Load()
	if last != 0 && now-last < int64(rejectLogEvery) || !c.rejected.lastLog[kind].CompareAndSwap(last, now) {
		return
	}
	since := total - c.rejected.logged[kind].Swap(total)
	c.log.Warn("redis: "+msg, append(args, "kind", rejectNames[kind], "rejected", since, "rejected_total", total)...)
}

// Rejected returns, by kind, how many values read from Redis were refused.
func (c *Cluster) Rejected() map[string]uint64 {
	m := make(map[string]uint64, rejectKinds)
	for i := range rejectKinds {
		m[rejectNames[i]] = c.rejected.n[i].Load()
	}
	return m
}
