package sip

import (
	"hash/maphash"
	"time"
)

// acceptedLinger is how long the branches of an INVITE answered 2xx are
// remembered: 64·T1, the Accepted state of RFC 6026 §7.1.
const acceptedLinger = 32 * time.Second

// acceptedSet remembers the branches of INVITE transactions that ended with
// a 2xx, for acceptedLinger to twice that (two generations, swapped whole:
// no per-entry sweep). It stands in for the Accepted state of RFC 6026
// without keeping the transaction: a response to one of these branches is
// no stray. Its 2xx (the backend's retransmissions, or another attempt's
// answer) is relayed, as every 2xx to an INVITE must be; anything else (a
// provisional answer, a non-2xx final answer, the answer to a CANCEL we
// sent) is dropped. Relayed after the 2xx, a backend's late 180 reached
// the client after its BYE was sent, for an INVITE it had the answer to
// (SIPp aborts the call: "unexpected message ... while expecting '200'
// (index 8), received 'SIP/2.0 180 Ringing'"). Branches are kept as 64-bit
// hashes: about 20 bytes a call, 8 MB at 6,000 calls/s. Guarded by
// txnTable.mu.
type acceptedSet struct {
	seed      maphash.Seed
	cur, prev map[uint64]struct{}
	swapped   int64 // when cur was started
}

// expireLocked drops the generations that are over at now.
func (a *acceptedSet) expireLocked(now int64) {
	switch {
	case a.cur == nil:
	case now-a.swapped >= 2*int64(acceptedLinger):
		a.prev, a.cur = nil, nil
	case now-a.swapped >= int64(acceptedLinger):
		a.prev, a.cur, a.swapped = a.cur, make(map[uint64]struct{}, len(a.cur)), now
	}
}

// addLocked remembers branches at now.
func (a *acceptedSet) addLocked(branches []string, now int64) {
	a.expireLocked(now)
	if a.cur == nil {
		if a.seed == (maphash.Seed{}) {
			a.seed = maphash.MakeSeed()
		}
		a.cur, a.swapped = map[uint64]struct{}{}, now
	}
	for _, b := range branches {
		a.cur[maphash.String(a.seed, b)] = struct{}{}
	}
}

// hasLocked reports whether br is the branch of an INVITE answered 2xx
// within the linger.
func (a *acceptedSet) hasLocked(br string, now int64) bool {
	a.expireLocked(now)
	if a.cur == nil {
		return false
	}
	h := maphash.String(a.seed, br)
	if _, ok := a.cur[h]; ok {
		return true
	}
	_, ok := a.prev[h]
	return ok
}

// lenLocked is how many branches are remembered (both generations).
func (a *acceptedSet) lenLocked() int { return len(a.cur) + len(a.prev) }
