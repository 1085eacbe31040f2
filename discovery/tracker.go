package discovery

import (
	"fmt"
	"net/netip"
	"time"
)

// Defaults of TrackConfig (flags -dns-min-ttl, -dns-max-ttl,
// -dns-keep-stale).
const (
	DefaultMinTTL    = 5 * time.Second
	DefaultMaxTTL    = 5 * time.Minute
	DefaultKeepStale = time.Hour
)

// TrackConfig bounds how often a name is asked again and how long its
// last good answer outlives failures.
type TrackConfig struct {
	// MinTTL is the shortest time between two lookups of a name, whatever
	// its TTL (a TTL of 0 would ask for every request), and the wait
	// before asking again after a failure. Flag -dns-min-ttl, default 5s.
	MinTTL time.Duration
	// MaxTTL is the longest: a change is seen within it even under a
	// day-long TTL. Flag -dns-max-ttl, default 5m.
	MaxTTL time.Duration
	// KeepStale is how long the last good answer stays in force while
	// the resolver fails or answers that the name is gone (NXDOMAIN, no
	// records); after it the name's addresses are dropped. Flag
	// -dns-keep-stale, default 1h.
	KeepStale time.Duration
}

// Check fills c's defaults and checks it; errors name the flag.
func (c *TrackConfig) Check() error {
	if c.MinTTL == 0 {
		c.MinTTL = DefaultMinTTL
	}
	if c.MaxTTL == 0 {
		c.MaxTTL = DefaultMaxTTL
	}
	if c.KeepStale == 0 {
		c.KeepStale = DefaultKeepStale
	}
	switch {
	case c.MinTTL < 100*time.Millisecond:
		return fmt.Errorf("-dns-min-ttl %s: want at least 100ms (every lookup is a query to the resolver)", c.MinTTL)
	case c.MaxTTL < c.MinTTL:
		return fmt.Errorf("-dns-max-ttl %s: want at least -dns-min-ttl (%s)", c.MaxTTL, c.MinTTL)
	case c.KeepStale < 0:
		return fmt.Errorf("-dns-keep-stale %s: must not be negative", c.KeepStale)
	}
	return nil
}

// Tracker follows one name: it turns each lookup's answer or error into
// the targets in force and says what changed. It keeps the last good
// answer through failures for KeepStale. Not safe for concurrent use.
type Tracker struct {
	cfg    TrackConfig
	last   []Target
	goodAt time.Time
	good   bool // an answer was seen
}

// NewTracker returns a Tracker of cfg (Check it first).
func NewTracker(cfg TrackConfig) *Tracker { return &Tracker{cfg: cfg} }

// Update is what one lookup changed.
type Update struct {
	// Targets are the targets in force after the lookup.
	Targets []Target
	// Added and Removed are the addresses that came and went; Unchanged
	// counts those that stayed (with or without a new weight or
	// priority).
	Added, Removed []Target
	Unchanged      int
	// Changed: Targets differ from before in any way (an address, a
	// weight, a priority, a transport).
	Changed bool
	// Next is when to look again: the answer's TTL bounded by MinTTL and
	// MaxTTL, MinTTL after a failure.
	Next time.Time
	// Stale: the lookup failed and the last good answer is kept.
	Stale bool
	// Expired: the lookup failed past KeepStale; the addresses are gone.
	Expired bool
	// Err is the lookup's error.
	Err error
}

// Observe records the outcome of a lookup at now.
func (t *Tracker) Observe(now time.Time, ans Answer, err error) Update {
	u := Update{Err: err, Next: now.Add(t.cfg.MinTTL)}
	next := ans.Targets
	switch {
	case err == nil:
		ttl := min(max(ans.TTL, t.cfg.MinTTL), t.cfg.MaxTTL)
		u.Next = now.Add(ttl)
		t.goodAt, t.good = now, true
	case t.good && now.Sub(t.goodAt) < t.cfg.KeepStale:
		u.Stale = true
		next = t.last
	default:
		u.Expired = t.good && len(t.last) > 0
		next = nil
	}
	u.Added, u.Removed, u.Unchanged = Diff(t.last, next)
	u.Changed = !sameTargets(t.last, next)
	t.last = next
	u.Targets = next
	return u
}

// Restore puts ts back in force after an Observe dropped them: the
// caller keeps them because nothing else would serve (a pool's only
// source). The time of the last good answer is unchanged, so the next
// failure drops them again (and the caller may restore them again).
func (t *Tracker) Restore(ts []Target) { t.last = ts }

// Targets returns the targets in force.
func (t *Tracker) Targets() []Target { return t.last }

// Diff compares two target lists by address.
func Diff(old, cur []Target) (added, removed []Target, unchanged int) {
	in := make(map[netip.AddrPort]bool, len(old))
	for _, t := range old {
		in[t.Addr] = true
	}
	now := make(map[netip.AddrPort]bool, len(cur))
	for _, t := range cur {
		now[t.Addr] = true
		if in[t.Addr] {
			unchanged++
		} else {
			added = append(added, t)
		}
	}
	for _, t := range old {
		if !now[t.Addr] {
			removed = append(removed, t)
		}
	}
	return added, removed, unchanged
}

func sameTargets(a, b []Target) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
