package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicelb/sluice/admission"
)

// Event kinds written by this package.
const (
	EventDown admission.EventKind = "cluster.down" // Redis unreachable: the fail policy is in force
	EventUp   admission.EventKind = "cluster.up"   // Redis answers again: budgets are shared again
)

// Cluster is this node's membership in a cluster: the heartbeat, one leaser
// per ARM rule, and the switch to the fail policy and back. Create it with
// New, attach rules with AttachRules, then Run it.
type Cluster struct {
	cfg    Config
	rdb    redis.UniversalClient
	clock  admission.Clock
	events admission.EventSink
	log    *slog.Logger
	prefix string // "{sluice:NAME}" hash tag shared by the membership key

	nodes      atomic.Int64 // node count: the most members seen over nodesMemory, at least 1
	seen       memberCounts // the heartbeats' member counts (heartbeat goroutine only)
	state      atomic.Int32 // stateUnknown until the first round trip, then stateUp or stateDown
	roundTrips atomic.Uint64
	failed     atomic.Uint64 // round trips that failed or timed out
	fails      atomic.Int32  // consecutive failures
	downs      atomic.Uint64

	dialogs   dialogBus
	rejected  rejects
	stateKeys atomic.Pointer[keySet] // seals MOP states; nil: no key ring (SetKeyRing)

	mu      sync.Mutex
	rules   []*ruleLease
	mops    []*mopShare
	running func(*ruleLease) // starts a leaser once Run is running
	lastErr string
	since   time.Time // of the current up or down state
}

// New returns a node of the cluster in cfg using rdb (see NewClient). It
// starts in the fail policy's mode until the first heartbeat answers. clock
// must be the clock decisions are made with.
func New(cfg Config, rdb redis.UniversalClient, clock admission.Clock, events admission.EventSink, logger *slog.Logger) (*Cluster, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	if rdb == nil {
		return nil, fmt.Errorf("%w: no Redis client", ErrConfig)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	c := &Cluster{cfg: cfg, rdb: rdb, clock: clock, events: events, prefix: "{sluice:" + cfg.Name + "}", since: time.Now(),
		log: logger.With("component", "cluster", "cluster", cfg.Name, "node", cfg.Node)}
	c.nodes.Store(1)
	return c, nil
}

// AttachRules puts every meter on a leased budget. Call it before Run.
func (c *Cluster) AttachRules(meters []*admission.Meter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range meters {
		r := newRuleLease(c, armBudget{m}, "arm")
		r.l.SetMode(c.failMode(), c.nodes.Load())
		m.SetLease(r.l)
		c.rules = append(c.rules, r)
	}
}

// SetLastNodes seeds the node count with the one an earlier run last saw
// (kept in the data directory), for as long as Redis has not answered: the
// fail policy "local" then divides each limit by it rather than by one, so
// a node restarted during a Redis outage keeps to its share.
func (c *Cluster) SetLastNodes(n int64) {
	if n < 1 || c.state.Load() == stateUp {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nodes.Store(n)
	for _, r := range c.leasesLocked() {
		r.l.SetMode(c.failMode(), n)
	}
}

// SyncRules follows a change of the rule set at run time (the control API,
// a reloaded -arm-file): meters new to the set get a leased budget (and a
// leaser, when Run is running), meters no longer in it stop leasing and
// give back what they hold. A rule changed in place keeps its meter, and
// so its lease: the lease reads the meter's limit at each request.
func (c *Cluster) SyncRules(meters []*admission.Meter) {
	c.mu.Lock()
	in := map[*admission.Meter]bool{}
	for _, m := range meters {
		in[m] = true
	}
	have := map[*admission.Meter]bool{}
	var keep, gone []*ruleLease
	for _, r := range c.rules {
		if ab, ok := r.m.(armBudget); ok && in[ab.m] {
			keep = append(keep, r)
			have[ab.m] = true
		} else {
			gone = append(gone, r)
		}
	}
	var added []*ruleLease
	for _, m := range meters {
		if have[m] {
			continue
		}
		r := newRuleLease(c, armBudget{m}, "arm")
		r.l.SetMode(c.failMode(), c.nodes.Load())
		m.SetLease(r.l)
		keep = append(keep, r)
		added = append(added, r)
	}
	c.rules = keep
	run := c.running
	c.mu.Unlock()
	for _, r := range gone {
		r.stop()
	}
	if run != nil {
		for _, r := range added {
			run(r)
		}
	}
}

// Run keeps the heartbeat and the leasers going until ctx is done, then
// returns unspent tokens and leaves the member set (best effort).
func (c *Cluster) Run(ctx context.Context) {
	var wg sync.WaitGroup
	c.heartbeat(ctx, false)
	c.mu.Lock()
	c.running = func(r *ruleLease) {
		wg.Add(1)
		go func() { defer wg.Done(); r.run(ctx) }()
	}
	for _, r := range c.rules {
		c.running(r)
	}
	for _, s := range c.mops {
		c.running(s.lease)
	}
	c.mu.Unlock()
	t := time.NewTicker(c.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			c.mu.Lock()
			c.running = nil
			c.mu.Unlock()
			wg.Wait()
			c.heartbeat(context.Background(), true)
			return
		case <-t.C:
			c.heartbeat(ctx, false)
			c.mu.Lock()
			mops := append([]*mopShare(nil), c.mops...)
			c.mu.Unlock()
			for _, s := range mops {
				s.sync(ctx)
			}
		}
	}
}

// heartbeat renews this node's membership (or leaves) and learns the node
// count; its success or failure moves the node between shared budgets and
// the fail policy.
func (c *Cluster) heartbeat(ctx context.Context, leave bool) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	flag := "0"
	if leave {
		flag = "1"
	}
	ttl := 3 * c.cfg.Heartbeat.Milliseconds()
	res, err := heartbeatScript.Run(ctx, c.rdb, []string{c.prefix + ":nodes"}, c.cfg.Node, ttl, flag, maxLockMS).Int64Slice()
	c.roundTrips.Add(1)
	if leave {
		return
	}
	if err == nil && len(res) != 2 {
		err = fmt.Errorf("heartbeat reply %v is not the script's", res)
	}
	if err != nil {
		c.roundTripFailed(err)
		return
	}
	c.fails.Store(0)
	if res[1] > 0 {
		c.rejectf(rejectNodes, int(res[1]), "members of the cluster alive beyond the longest heartbeat, or a member set of another type, removed", "key", c.prefix+":nodes")
	}
	n := max(1, res[0])
	if n > maxNodes {
		// More members than a cluster has: someone else wrote them. Keep
		// the last count (shares stay as they were) rather than divide
		// every budget by it.
		c.rejectf(rejectNodes, 1, "member count beyond any cluster's; keeping the last one", "members", n, "max", maxNodes)
		n = c.nodes.Load()
	}
	c.nodes.Store(c.seen.add(c.clock.Now(), n))
	c.setUp(true, nil)
}

// nodesMemory is how long a member count seen by a heartbeat keeps
// counting. A member is dropped from Redis's set when its heartbeat is 3
// periods late (150 ms by default), which a node on a loaded machine can
// be for a moment; the count it would leave behind is too small, and if
// Redis went away right then, every node would keep limit ÷ (that count)
// on its own: over the cluster's limit (seen under CI load: three nodes
// each at limit ÷ 2). Taking the most members seen over the last half
// second rides out such a heartbeat; a node that really left (killed)
// still stops counting within a second (TTL + nodesMemory), which
// TestE2ENodeKilled holds the cluster to.
const nodesMemory = 500 * time.Millisecond

// memberCounts remembers the member counts of recent heartbeats.
type memberCounts struct {
	at [128]int64 // monotonic ns of each count; ring
	n  [128]int64
	i  int
}

// add records count n at now and returns the most members seen within
// nodesMemory of now.
func (m *memberCounts) add(now, n int64) int64 {
	m.at[m.i], m.n[m.i] = now, n
	m.i = (m.i + 1) % len(m.at)
	most := n
	for j := range m.at {
		if m.n[j] != 0 && now-m.at[j] < int64(nodesMemory) && m.n[j] > most {
			most = m.n[j]
		}
	}
	return most
}

// failMode is the lease mode of the fail policy.
func (c *Cluster) failMode() int32 {
	switch c.cfg.Fail {
	case FailOpen:
		return admission.LeaseOpen
	case FailClosed:
		return admission.LeaseClosed
	}
	return admission.LeaseLocal
}

// Redis reachability as the node last saw it.
const (
	stateUnknown int32 = iota
	stateUp
	stateDown
)

// setUp records the outcome of a round trip; a change of state switches
// every rule's lease mode, writes an event and logs once.
func (c *Cluster) setUp(ok bool, err error) {
	want := stateDown
	if ok {
		want = stateUp
	}
	if c.state.Load() == want {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state.Load() == want {
		return
	}
	first := c.state.Load() == stateUnknown
	c.state.Store(want)
	c.since = time.Now()
	if ok {
		c.lastErr = ""
		for _, r := range c.leasesLocked() {
			r.seed.Store(true)
			r.l.SetMode(admission.LeaseShared, 1)
		}
		msg := fmt.Sprintf("cluster %s: Redis answers again; budgets are shared by %d nodes", c.cfg.Name, c.nodes.Load())
		if first {
			msg = fmt.Sprintf("cluster %s: joined as %s; budgets are shared by %d nodes", c.cfg.Name, c.cfg.Node, c.nodes.Load())
		}
		c.log.Info("redis reachable, budgets shared", "nodes", c.nodes.Load())
		c.emit(EventUp, msg)
		return
	}
	c.downs.Add(1)
	if err != nil {
		c.lastErr = err.Error()
	}
	n := c.nodes.Load()
	for _, r := range c.leasesLocked() {
		r.l.Drain() // counted in Redis already; spending them later could overrun a window
		r.l.SetMode(c.failMode(), n)
	}
	what := map[FailPolicy]string{
		FailLocal:  fmt.Sprintf("each node enforces its share, limit ÷ %d", n),
		FailOpen:   "each node enforces the full limit on its own",
		FailClosed: "rules refuse what they match",
	}[c.cfg.Fail]
	msg := fmt.Sprintf("cluster %s: Redis unreachable (%v); fail policy %s: %s; retrying every %s",
		c.cfg.Name, err, c.cfg.Fail, what, c.cfg.Heartbeat)
	c.log.Warn("redis unreachable, fail policy in force", "policy", c.cfg.Fail.String(), "nodes", n, "err", err)
	c.emit(EventDown, msg)
}

func (c *Cluster) emit(kind admission.EventKind, msg string) {
	if c.events != nil {
		c.events(admission.Event{Time: time.Now(), Kind: kind, Subject: c.cfg.Name, Message: msg})
	}
}

// maxNodes is the most members a cluster is taken to have; a larger count
// read from Redis is not used.
const maxNodes = 1024

// failuresToDown is how many round trips in a row must fail before the
// node switches to the fail policy: one slow answer on a loaded machine
// should not make the whole node flap.
const failuresToDown = 2

// roundTripFailed reports a failed round trip (heartbeat or lease).
func (c *Cluster) roundTripFailed(err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	c.failed.Add(1)
	if c.fails.Add(1) >= failuresToDown {
		c.setUp(false, err)
	}
}

// leasesLocked returns every leaser: the rules' and the backends'. The
// caller holds mu.
func (c *Cluster) leasesLocked() []*ruleLease {
	all := append([]*ruleLease(nil), c.rules...)
	for _, s := range c.mops {
		all = append(all, s.lease)
	}
	return all
}

// Up reports whether Redis answered the latest round trip.
func (c *Cluster) Up() bool { return c.state.Load() == stateUp }

// Nodes returns the last known node count.
func (c *Cluster) Nodes() int64 { return c.nodes.Load() }

// RoundTrips returns the Redis round trips made since start.
func (c *Cluster) RoundTrips() uint64 { return c.roundTrips.Load() }

// RuleStatus is one rule's leasing for /status.
type RuleStatus struct {
	Name     string `json:"name"`
	Mode     string `json:"mode"` // shared, local, open or closed
	Tokens   int64  `json:"tokens"`
	Leases   uint64 `json:"leases"`
	Granted  uint64 `json:"granted"`
	Returned uint64 `json:"returned"`
}

// Status is the node's view of the cluster for /status.
type Status struct {
	Name       string       `json:"name"`
	Node       string       `json:"node"`
	Redis      string       `json:"redis"` // "up" or "down"
	Since      time.Time    `json:"since"`
	FailPolicy string       `json:"fail_policy"`
	Nodes      int64        `json:"nodes"`
	LastError  string       `json:"last_error,omitempty"`
	Downs      uint64       `json:"downs"`
	RoundTrips uint64       `json:"round_trips"`
	Failed     uint64       `json:"failed_round_trips"`
	Rules      []RuleStatus `json:"rules"`
	Backends   []MOPStatus  `json:"backends,omitempty"`
	Dialogs    DialogStats  `json:"dialogs"`
	// Rejected counts, by kind, values read from Redis that were out of
	// range and not used (see the README, "Trust").
	Rejected map[string]uint64 `json:"redis_rejected"`
}

var modeNames = [...]string{"shared", "local", "open", "closed"}

// Status returns the node's view of the cluster.
func (c *Cluster) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := Status{Name: c.cfg.Name, Node: c.cfg.Node, Redis: "down", Since: c.since, FailPolicy: c.cfg.Fail.String(),
		Nodes: c.nodes.Load(), LastError: c.lastErr, Downs: c.downs.Load(), RoundTrips: c.roundTrips.Load(), Failed: c.failed.Load(), Dialogs: c.Dialogs(),
		Rejected: c.Rejected()}
	if c.Up() {
		st.Redis = "up"
	}
	for _, r := range c.rules {
		st.Rules = append(st.Rules, RuleStatus{Name: r.m.Name(), Mode: modeNames[r.l.Mode()], Tokens: r.l.Tokens(),
			Leases: r.leases.Load(), Granted: r.granted.Load(), Returned: r.returned.Load()})
	}
	mops := append([]*mopShare(nil), c.mops...)
	c.mu.Unlock()
	for _, s := range mops { // s.mu is taken before c.mu elsewhere: not under c.mu
		st.Backends = append(st.Backends, s.status())
	}
	c.mu.Lock() // for the deferred unlock
	return st
}
