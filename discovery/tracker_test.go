package discovery

import (
	"errors"
	"net/netip"
	"testing"
	"time"
)

func tg(s ...string) []Target {
	var out []Target
	for _, a := range s {
		out = append(out, Target{Addr: netip.MustParseAddrPort(a)})
	}
	return out
}

// TestTracker walks one name through answers, failures and NXDOMAIN
// with an injected clock: TTLs bounded, the last good answer kept for
// KeepStale, then dropped.
func TestTracker(t *testing.T) {
	cfg := TrackConfig{MinTTL: 5 * time.Second, MaxTTL: time.Minute, KeepStale: 90 * time.Second}
	if err := cfg.Check(); err != nil {
		t.Fatal(err)
	}
	tr := NewTracker(cfg)
	t0 := time.Unix(1000, 0)
	fail := errors.New("timeout")
	nx := ErrNotFound
	steps := []struct {
		at        time.Duration
		ans       []Target
		ttl       time.Duration
		err       error
		want      string
		next      time.Duration // after at
		changed   bool
		added     int
		removed   int
		unchanged int
		stale     bool
		expired   bool
	}{
		{0, tg("10.0.0.1:80", "10.0.0.2:80"), 1 * time.Second, nil, "10.0.0.1:80 10.0.0.2:80", 5 * time.Second, true, 2, 0, 0, false, false},
		{5 * time.Second, tg("10.0.0.1:80", "10.0.0.2:80"), 30 * time.Second, nil, "10.0.0.1:80 10.0.0.2:80", 30 * time.Second, false, 0, 0, 2, false, false},
		{35 * time.Second, tg("10.0.0.2:80", "10.0.0.3:80"), time.Hour, nil, "10.0.0.2:80 10.0.0.3:80", time.Minute, true, 1, 1, 1, false, false},
		{95 * time.Second, nil, 0, fail, "10.0.0.2:80 10.0.0.3:80", 5 * time.Second, false, 0, 0, 2, true, false},
		{120 * time.Second, nil, 0, nx, "10.0.0.2:80 10.0.0.3:80", 5 * time.Second, false, 0, 0, 2, true, false},
		{125 * time.Second, nil, 0, fail, "", 5 * time.Second, true, 0, 2, 0, false, true},
		{130 * time.Second, nil, 0, fail, "", 5 * time.Second, false, 0, 0, 0, false, false},
		{135 * time.Second, tg("10.0.0.4:80"), 0, nil, "10.0.0.4:80", 5 * time.Second, true, 1, 0, 0, false, false},
	}
	for i, s := range steps {
		now := t0.Add(s.at)
		u := tr.Observe(now, Answer{Targets: s.ans, TTL: s.ttl}, s.err)
		if got := addrs(u.Targets); got != s.want {
			t.Errorf("step %d: targets %q, want %q", i, got, s.want)
		}
		if u.Next.Sub(now) != s.next {
			t.Errorf("step %d: next in %s, want %s", i, u.Next.Sub(now), s.next)
		}
		if u.Changed != s.changed || len(u.Added) != s.added || len(u.Removed) != s.removed || u.Unchanged != s.unchanged || u.Stale != s.stale || u.Expired != s.expired {
			t.Errorf("step %d: changed %v +%d -%d =%d stale %v expired %v; want %v +%d -%d =%d %v %v", i,
				u.Changed, len(u.Added), len(u.Removed), u.Unchanged, u.Stale, u.Expired,
				s.changed, s.added, s.removed, s.unchanged, s.stale, s.expired)
		}
	}
	// A weight change is a change without an address change.
	a := []Target{{Addr: netip.MustParseAddrPort("10.0.0.4:80"), Weight: 5}}
	if u := tr.Observe(t0.Add(200*time.Second), Answer{Targets: a}, nil); !u.Changed || u.Unchanged != 1 {
		t.Errorf("weight change: %+v", u)
	}
}

func TestTrackConfigCheck(t *testing.T) {
	for _, c := range []struct {
		cfg  TrackConfig
		want string
	}{
		{TrackConfig{}, ""},
		{TrackConfig{MinTTL: time.Millisecond}, "-dns-min-ttl 1ms"},
		{TrackConfig{MinTTL: time.Minute, MaxTTL: time.Second}, "-dns-max-ttl 1s: want at least -dns-min-ttl (1m0s)"},
		{TrackConfig{KeepStale: -time.Second}, "-dns-keep-stale -1s"},
	} {
		err := c.cfg.Check()
		if c.want == "" {
			if err != nil || c.cfg.MinTTL != DefaultMinTTL || c.cfg.MaxTTL != DefaultMaxTTL || c.cfg.KeepStale != DefaultKeepStale {
				t.Errorf("defaults: %v %+v", err, c.cfg)
			}
			continue
		}
		if err == nil || len(err.Error()) < len(c.want) || err.Error()[:len(c.want)] != c.want {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}
}
