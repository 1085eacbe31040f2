package accesslog

// The writers: one goroutine per destination takes records from its
// protocol's ring (both rings when the protocols share the destination),
// formats the sampled ones and hands them to the destination and to the
// sinks that want them. Each destination has its own writer, so a slow or
// blocked destination stalls only its own: its ring fills and its
// protocol's records are dropped and counted, while the other protocol's
// log goes on.

import (
	"log/slog"
	"sync/atomic"
	"time"
)

// writerTick is how often a writer looks at its rings when no record
// woke it: how late a line may reach its destination at low load.
const writerTick = 20 * time.Millisecond

// batch is how many records a writer takes from one ring before it
// looks at the other, so a flood of one protocol does not starve the other.
const batch = 256

// writer is one destination's goroutine.
type writer struct {
	l         *Logger
	d         dest // nil: its protocols have no destination (sinks only)
	http, sip bool // the rings it drains
	wake      chan struct{}
	reopen    atomic.Bool
	done      chan struct{}
	line      []byte
	stamps    stampCache
	warn      warner
}

func (l *Logger) newWriter(d dest, http, sip bool) *writer {
	w := &writer{l: l, d: d, http: http, sip: sip, wake: make(chan struct{}, 1), done: make(chan struct{})}
	w.warn = warner{log: l.opts.Log, now: l.opts.Now, dest: destName(d)}
	l.writers = append(l.writers, w)
	return w
}

// destName is d's name for messages, "none" for none.
func destName(d dest) string {
	if d == nil {
		return "none"
	}
	return d.String()
}

func (w *writer) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// fail counts a destination's failure and warns about it.
func (w *writer) fail(op string, err error) {
	w.l.errs.Add(1)
	w.warn.warn(op, err)
}

func (w *writer) run() {
	defer close(w.done)
	tick := time.NewTicker(writerTick)
	defer tick.Stop()
	for {
		if w.reopen.Swap(false) && w.d != nil {
			if err := w.d.reopen(); err != nil {
				w.fail("reopen", err)
			}
		}
		n := 0
		for {
			a := w.drainHTTP()
			b := w.drainSIP()
			n += a + b
			if a+b == 0 {
				break
			}
		}
		if n > 0 {
			w.flush()
		}
		select {
		case <-w.wake:
		case <-tick.C:
		case <-w.l.quit:
			for w.drainHTTP()+w.drainSIP() > 0 {
			}
			w.flush()
			return
		}
	}
}

func (w *writer) flush() {
	if w.d == nil {
		return
	}
	if err := w.d.flush(); err != nil {
		w.fail("write", err)
	}
}

func (w *writer) drainHTTP() int {
	if !w.http {
		return 0
	}
	l := w.l
	n := 0
	for ; n < batch; n++ {
		s := l.http.take()
		if s == nil {
			break
		}
		var out []byte
		if s.logged {
			w.line = l.fmtHTTP(w.line[:0], &s.rec, &w.stamps)
			out = w.line
			if err := w.d.add(out, HTTP, s.rec.Start); err != nil {
				w.fail("write", err)
			}
		}
		for i, sk := range l.opts.Sinks {
			if i < 64 && s.sinks&(1<<i) != 0 {
				sk.WriteHTTP(&s.rec, out)
			}
		}
		l.http.release(s)
	}
	return n
}

func (w *writer) drainSIP() int {
	if !w.sip {
		return 0
	}
	l := w.l
	n := 0
	for ; n < batch; n++ {
		s := l.sip.take()
		if s == nil {
			break
		}
		var out []byte
		if s.logged {
			w.line = l.fmtSIP(w.line[:0], &s.rec, &w.stamps)
			out = w.line
			if err := w.d.add(out, SIP, s.rec.Start); err != nil {
				w.fail("write", err)
			}
		}
		for i, sk := range l.opts.Sinks {
			if i < 64 && s.sinks&(1<<i) != 0 {
				sk.WriteSIP(&s.rec, out)
			}
		}
		l.sip.release(s)
	}
	return n
}

// warner reports a destination's failures: the first at once, then at
// most one line per WarnEvery, counting the failures since the last
// line, so a full disk is seen in sluice's own log without a line per
// failed write. Only its writer uses it.
type warner struct {
	log   *slog.Logger
	now   func() time.Time
	dest  string
	last  time.Time // of the last line; zero: none yet
	count int       // failures since the last line
}

func (w *warner) warn(op string, err error) {
	w.count++
	now := w.now()
	if !w.last.IsZero() && now.Sub(w.last) < WarnEvery {
		return
	}
	w.log.Warn("access log destination failing: lines are lost",
		"dest", w.dest, "op", op, "err", err, "failures", w.count)
	w.last, w.count = now, 0
}
