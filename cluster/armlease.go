package cluster

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// budget is what a ruleLease keeps supplied: an ARM rule or a backend's MOP.
type budget interface {
	Name() string
	// limit is the most admissions per second-scaled unit the cluster may
	// make in the memory state st.
	limit(st admission.MemState) int64
	sub() time.Duration
	queued() int64
	// windowRate is what this node admitted in the current window (the seed
	// after a rejoin).
	windowRate() int64
	// advance serves queued requests after a grant.
	advance(now int64)
}

type armBudget struct{ m *admission.Meter }

func (b armBudget) Name() string                      { return b.m.Name() }
func (b armBudget) limit(st admission.MemState) int64 { return b.m.LimitIn(st) }
func (b armBudget) sub() time.Duration                { return b.m.SubInterval() }
func (b armBudget) queued() int64                     { return b.m.Status().Queued }
func (b armBudget) windowRate() int64                 { return b.m.Status().Rate }
func (b armBudget) advance(now int64)                 { b.m.Advance(now) }

// expiryMargin ends a lease's tokens this much before the shared
// sub-interval they were counted in ends (see lease).
const expiryMargin = 2 * time.Millisecond

// ruleLease keeps one ARM rule (or one backend's MOP) supplied with tokens
// from its shared counters. Its methods other than run are called from
// run's goroutine only (or, in tests and the simulation, from one
// goroutine).
type ruleLease struct {
	c     *Cluster
	m     budget
	l     *admission.Lease
	key   string
	subUS int64 // sub-interval in µs, the script's unit

	seed atomic.Bool // count the local window once after a rejoin

	// Owned by the leasing goroutine.
	heldK      int64      // shared sub-interval of the tokens held
	from       int64      // monotonic ns from which they may be spent
	expires    int64      // monotonic ns when those tokens stop being spendable; 0: none held
	dryUntil   int64      // monotonic ns: no request before (budget spent, or K not over yet)
	kEnd       int64      // monotonic ns by which the shared sub-interval K has surely ended
	subEnded   bool       // boundary has taken this sub-interval's arrivals
	lastArr    int64      // Arrivals at the last boundary
	perSub     int64      // arrivals in the last sub-interval
	wantNow    int64      // latest request in this sub-interval (doubles while short)
	retK, retN int64      // unspent tokens to give back to shared sub-interval retK
	own        [7]ownSlot // what this node counted in the live shared sub-intervals
	retryAfter time.Duration

	leases, granted, returned atomic.Uint64
	cancel                    atomic.Pointer[context.CancelFunc]
}

// stop ends the leaser's loop (its unspent tokens go back).
func (r *ruleLease) stop() {
	if f := r.cancel.Load(); f != nil {
		(*f)()
	}
}

func newRuleLease(c *Cluster, m budget, kind string) *ruleLease {
	return &ruleLease{c: c, m: m, l: admission.NewLease(c.cfg.Wait, c.clock),
		key:   c.prefix[:len(c.prefix)-1] + ":" + kind + ":" + m.Name() + "}",
		subUS: int64(m.sub() / time.Microsecond)}
}

// want sizes the next request: the node's own arrivals over half a
// sub-interval, doubled each time the node runs short again within one
// sub-interval, and at least what is queued. The script caps it near the
// limit.
func (r *ruleLease) want() int64 {
	w := (r.perSub + 1) / 2
	if r.wantNow*2 > w {
		w = r.wantNow * 2
	}
	if q := r.m.queued(); q > w {
		w = q
	}
	if w < 1 {
		w = 1
	}
	if lim := r.m.limit(r.l.State()); w > lim {
		w = lim
	}
	return w
}

// lease makes one round trip: gives back the pending return, asks for want
// (0: return only), and grants what came. now is the monotonic time before
// the call: a token's deadline is computed from it, so the local deadline
// never falls after the shared sub-interval's end.
func (r *ruleLease) lease(ctx context.Context, now, want int64) error {
	if r.c.state.Load() != stateUp {
		return nil
	}
	var seed int64
	if r.seed.Swap(false) {
		// After Redis was away (perhaps restarted empty) the window may have
		// lost what this node admitted meanwhile: count it again, once.
		seed = r.m.windowRate()
	}
	lim := r.m.limit(r.l.State())
	ctx, cancel := context.WithTimeout(ctx, r.c.cfg.Timeout)
	defer cancel()
	ret := r.retN
	res, err := leaseScript.Run(ctx, r.c.rdb, []string{r.key, r.key + ":lost"}, lim, want, r.subUS, r.c.nodes.Load(), r.retK, ret, seed, r.ownCounts()).Int64Slice()
	r.c.roundTrips.Add(1)
	if err == nil {
		if err = r.checkReply(res, want); err != nil {
			r.c.rejectf(rejectLeaseReply, 1, "lease reply out of range; not used", "key", r.key, "err", err)
		}
	}
	if err != nil {
		if seed > 0 {
			r.seed.Store(true)
		}
		// A round trip that timed out may have run: giving the same tokens
		// back again could count them twice. Keep them counted instead.
		r.retN = 0
		r.c.roundTripFailed(err)
		return err
	}
	recv := r.c.clock.Now()
	r.c.fails.Store(0)
	r.leases.Add(1)
	r.returned.Add(uint64(ret))
	r.retN = 0
	if res[5] > 0 {
		r.c.rejectf(rejectLeaseField, int(res[5]), "invalid fields deleted from a rule's counters in Redis", "key", r.key)
	}
	if res[6] > 0 {
		r.c.rejectf(rejectLeaseLost, int(res[6]), "a rule's counters in Redis held fewer tokens than this node alone counted (flushed or lowered by another client); restored", "key", r.key)
	}
	g, k, untilEnd := res[0], res[2], res[3]
	r.addOwn(r.retK, -ret)
	r.addOwn(k, g+seed)
	r.pruneOwn(k)
	r.retryAfter = time.Duration(res[4]) * time.Microsecond
	// The reply's time may be Redis's cached time of the event loop
	// iteration, a little before our request arrived: end the tokens'
	// validity a margin early so none is spent after K ends.
	end := now + untilEnd*int64(time.Microsecond) - int64(expiryMargin)
	r.kEnd = recv + untilEnd*int64(time.Microsecond)
	if want == 0 {
		return nil
	}
	if k != r.heldK {
		r.wantNow = 0
	}
	r.wantNow = max(r.wantNow, want)
	if g <= 0 {
		r.dryUntil = r.kEnd
		r.l.SetDryUntil(r.kEnd)
		return nil
	}
	r.granted.Add(uint64(g))
	if k != r.heldK && r.expires != 0 {
		// The shared sub-interval moved on during the round trip: tokens of
		// the old one must not be spent in the new one.
		r.giveBack(r.l.Drain())
	}
	if k != r.heldK || r.expires == 0 {
		// Redis ran the script between sending and now, inside K: K had
		// begun by now, so decisions from now on belong to it.
		r.from = recv
	}
	r.heldK, r.expires = k, end
	r.l.Grant(g, r.from, end)
	if r.m.queued() > 0 {
		r.m.advance(r.c.clock.Now()) // the queue is served from the new tokens first
	}
	return nil
}

// checkReply refuses a lease reply that the script cannot have given: a
// grant above want or negative, a sub-interval end or a Retry-After out of
// the window. Such a reply is a failed round trip; nothing of it is used.
func (r *ruleLease) checkReply(res []int64, want int64) error {
	if len(res) != 7 {
		return fmt.Errorf("lease reply of %d values, want 7", len(res))
	}
	g, k, untilEnd, retry := res[0], res[2], res[3], res[4]
	switch {
	case g < 0 || g > want:
		return fmt.Errorf("lease reply grants %d, asked %d", g, want)
	case k <= 0 || untilEnd <= 0 || untilEnd > r.subUS:
		return fmt.Errorf("lease reply: sub-interval %d ends in %dµs, want (0, %d]", k, untilEnd, r.subUS)
	case retry < 0 || retry > 6*r.subUS:
		return fmt.Errorf("lease reply: Retry-After %dµs, want at most one window", retry)
	case res[5] < 0 || res[6] < 0:
		return fmt.Errorf("lease reply: %d invalid fields, %d tokens restored", res[5], res[6])
	}
	return nil
}

// ownSlot is what this node counted in one shared sub-interval.
type ownSlot struct{ k, n int64 }

// addOwn adds n (negative: a return) to this node's count of shared
// sub-interval k, never below zero.
func (r *ruleLease) addOwn(k, n int64) {
	if n == 0 || k == 0 {
		return
	}
	for i := range r.own {
		if r.own[i].k == k {
			r.own[i].n = max(0, r.own[i].n+n)
			return
		}
	}
	if n < 0 {
		return
	}
	oldest := 0
	for i := range r.own {
		if r.own[i].k < r.own[oldest].k {
			oldest = i
		}
	}
	r.own[oldest] = ownSlot{k, n}
}

// pruneOwn forgets sub-intervals out of the window that ends with k.
func (r *ruleLease) pruneOwn(k int64) {
	for i := range r.own {
		if r.own[i].k <= k-6 {
			r.own[i] = ownSlot{}
		}
	}
}

// ownCounts is the script's argument of this node's counts, "K:N,K:N".
func (r *ruleLease) ownCounts() string {
	var b []byte
	for _, o := range r.own {
		if o.n > 0 {
			if len(b) > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, o.k, 10)
			b = append(b, ':')
			b = strconv.AppendInt(b, o.n, 10)
		}
	}
	return string(b)
}

// giveBack queues n unspent tokens of the held sub-interval for return with
// the next round trip. A return still pending from an older sub-interval is
// dropped: it stays counted, which only makes the cluster more cautious.
func (r *ruleLease) giveBack(n int64) {
	if n <= 0 {
		return
	}
	if r.retN > 0 && r.retK != r.heldK {
		r.retN = 0
	}
	r.retK = r.heldK
	r.retN += n
}

// boundary ends the held sub-interval at the tokens' deadline, a little
// before Redis moves on: unspent tokens are taken back, and the next request
// (which carries them back) waits until K has surely ended, so that it is
// granted from K+1. Decisions meanwhile wait for it within their budget.
func (r *ruleLease) boundary(now int64) {
	r.giveBack(r.l.Drain())
	r.expires = 0
	r.dryUntil = max(r.dryUntil, r.kEnd)
	r.endSub()
}

// endSub takes the arrivals of the sub-interval that ends.
func (r *ruleLease) endSub() {
	arr := r.l.Arrivals()
	r.perSub, r.lastArr = arr-r.lastArr, arr
	r.subEnded = true
}

// onNeed answers a decision that ran short.
func (r *ruleLease) onNeed(ctx context.Context, now int64) {
	switch {
	case r.expires != 0 && now >= r.expires:
		r.boundary(now)
	case now < r.dryUntil:
		// spent, or K not over yet: the timer asks at dryUntil
	default:
		r.lease(ctx, now, r.want())
	}
}

// next is when the loop must act without being asked: at the end of the
// held tokens' validity, or when a new sub-interval has surely begun.
func (r *ruleLease) next() int64 {
	switch {
	case r.expires != 0:
		return r.expires
	case r.dryUntil != 0:
		return r.dryUntil
	}
	return 0
}

// tick acts on next's deadline.
func (r *ruleLease) tick(ctx context.Context, now int64) {
	switch {
	case r.expires != 0 && now >= r.expires:
		r.boundary(now)
	case r.dryUntil != 0 && now >= r.dryUntil:
		r.dryUntil = 0
		if !r.subEnded {
			r.endSub() // a sub-interval without tokens ends here
		}
		r.subEnded = false
		var want int64
		if r.perSub > 0 || r.m.queued() > 0 || r.l.Arrivals() > r.lastArr {
			want = r.want()
		}
		if want > 0 || r.retN > 0 {
			r.lease(ctx, now, want)
		}
	}
}

// run is the rule's leasing loop.
func (r *ruleLease) run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r.cancel.Store(&cancel)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if r.c.state.Load() != stateUp {
			r.expires, r.dryUntil = 0, 0
		}
		wait := time.Hour
		if n := r.next(); n != 0 {
			wait = time.Duration(n - r.c.clock.Now())
			if wait < 0 {
				wait = 0
			}
		}
		if r.c.state.Load() != stateUp {
			wait = r.c.cfg.Heartbeat
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			r.giveBack(r.l.Drain())
			if r.retN > 0 {
				r.lease(context.Background(), r.c.clock.Now(), 0)
			}
			return
		case <-r.l.Need():
			r.onNeed(ctx, r.c.clock.Now())
		case <-timer.C:
			r.tick(ctx, r.c.clock.Now())
		}
	}
}
