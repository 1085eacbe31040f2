package tlsedge

import (
	"net/netip"
	"sync"
	"time"
)

// Refusal is why a handshake was refused (HandshakeLimiter.TryFrom), or
// NotRefused.
type Refusal uint8

const (
	NotRefused      Refusal = iota
	RefusedInFlight         // -tls-handshakes-max under way (or a gate that does not say why)
	RefusedSource           // the source has its share of them under way
	RefusedRate             // over -tls-handshake-rate
	numRefusals
)

// String is the reason as /metrics labels it: in_flight, source, rate.
func (r Refusal) String() string {
	switch r {
	case NotRefused:
		return "none"
	case RefusedInFlight:
		return "in_flight"
	case RefusedSource:
		return "source"
	case RefusedRate:
		return "rate"
	}
	return "unknown"
}

// RefusalLogEvery is the least time between two lines of a RefusalLog.
const RefusalLogEvery = 10 * time.Second

// refusalSources is how many sources a RefusalLog counts in a window:
// the top source is the top of the first ones refused, so that a flood
// from many addresses costs a bounded table.
const refusalSources = 64

// RefusalLog gathers a front end's handshake refusals for its log, which
// says nothing otherwise: a client refused a handshake sees its connection
// closed, and the operator only a counter. A line is due at the first
// refusal, then at the first one at least RefusalLogEvery after the last
// line, and tells the refusals since it by reason and the source refused
// most (of the first 64 refused since). No goroutine: refusals that end a
// flood wait for the next refusal to be told (the counters of /metrics
// have them at once). The zero value is ready; safe for concurrent use.
type RefusalLog struct {
	mu     sync.Mutex
	logged bool  // a line was written
	last   int64 // when (monotonic ns)
	counts [numRefusals]uint64
	by     map[netip.Addr]uint64
}

// RefusalSummary is what a RefusalLog line says: the refusals since the
// last line by reason, and the source (an IPv4 address, an IPv6 /64)
// refused most, with its count (invalid when no refusal had a source).
type RefusalSummary struct {
	InFlight, Source, Rate uint64
	Top                    netip.Addr
	TopRefusals            uint64
}

// Note counts a refusal of why to src (invalid: not counted per source)
// at now (monotonic ns); when a line is due it returns what it says and
// true, and starts counting anew.
func (r *RefusalLog) Note(why Refusal, src netip.Addr, now int64) (RefusalSummary, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if why > NotRefused && why < numRefusals {
		r.counts[why]++
	}
	if src.IsValid() {
		k := sourceKey(src)
		if _, ok := r.by[k]; ok || len(r.by) < refusalSources {
			if r.by == nil {
				r.by = make(map[netip.Addr]uint64)
			}
			r.by[k]++
		}
	}
	if r.logged && now-r.last < int64(RefusalLogEvery) {
		return RefusalSummary{}, false
	}
	sum := RefusalSummary{InFlight: r.counts[RefusedInFlight], Source: r.counts[RefusedSource], Rate: r.counts[RefusedRate]}
	for k, n := range r.by {
		if n > sum.TopRefusals || n == sum.TopRefusals && k.Less(sum.Top) {
			sum.Top, sum.TopRefusals = k, n
		}
	}
	r.logged, r.last = true, now
	r.counts = [numRefusals]uint64{}
	clear(r.by)
	return sum, true
}

// Args are the summary as slog key-value pairs, the same on every front
// end: in_flight, source, rate, and top_source, top_source_refusals when
// a source was counted.
func (s RefusalSummary) Args() []any {
	a := []any{"in_flight", s.InFlight, "source", s.Source, "rate", s.Rate}
	if s.Top.IsValid() {
		a = append(a, "top_source", s.Top.String(), "top_source_refusals", s.TopRefusals)
	}
	return a
}
