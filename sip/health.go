package sip

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	gosip "github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/lb"
)

// pingTable holds the OPTIONS health probes in flight, keyed by branch.
type pingTable struct {
	mu  sync.Mutex
	m   map[string]pingWait
	seq uint64
}

// pingWait is a ping in flight: where it went, and where its answer goes.
type pingWait struct {
	ch  chan int
	to  target
	lbb *lb.Backend
}

func (pt *pingTable) init() { pt.m = map[string]pingWait{} }

// Prober returns the SIP health check of backend b: an OPTIONS to the
// address and transport of spec (RFC 3261 §11). Any answer means up; a
// 503 also backs the backend off for its Retry-After; silence until the
// probe's deadline means down. Rise/fall counting is lb.HealthChecker's.
// It is the lb.GenConfig.Prober of a SIP generation (pool is not used: a
// SIP pool has no health path). The address is resolved here, once; one
// that does not resolve gives a prober that is always down, saying why.
// The pings leave from the server's socket: before Start they are down.
func (s *Server) Prober(b *lb.Backend, spec lb.BackendSpec, pool *lb.PoolSpec) lb.Prober {
	ap, tcp, err := resolveSpec(spec)
	if err != nil {
		return lb.ProberFunc(func(context.Context, *lb.Backend) (lb.ProbeResult, error) {
			return lb.ProbeDown, fmt.Errorf("ping %s: %w", spec.ID, err)
		})
	}
	return optionsProber{s: s, id: spec.ID, to: target{addr: ap, tcp: tcp}}
}

// optionsProber is the OPTIONS health check of one backend (Prober).
type optionsProber struct {
	s  *Server
	id string
	to target
}

var _ lb.Prober = optionsProber{}

// errNotStarted is the verdict of a ping before Start.
var errNotStarted = errors.New("the SIP front end is not listening yet")

// Probe implements lb.Prober.
func (p optionsProber) Probe(ctx context.Context, lbb *lb.Backend) (lb.ProbeResult, error) {
	s := p.s
	if !s.listening.Load() {
		return lb.ProbeDown, fmt.Errorf("ping %s: %w", p.id, errNotStarted)
	}
	s.pings.mu.Lock()
	s.pings.seq++
	seq := s.pings.seq
	branch := pingBranchPrefix + strconv.FormatUint(seq, 36) + "x" + strconv.FormatUint(fastRand()&0xffffffff, 36)
	ch := make(chan int, 1)
	s.pings.m[branch] = pingWait{ch: ch, to: p.to, lbb: lbb}
	s.pings.mu.Unlock()
	defer func() {
		s.pings.mu.Lock()
		delete(s.pings.m, branch)
		s.pings.mu.Unlock()
	}()
	s.metrics.PingsSent.Add(1)
	if err := s.sendBytes(s.pingMessage(p.to, branch, seq), p.to); err != nil {
		s.metrics.PingsFailed.Add(1)
		return lb.ProbeDown, fmt.Errorf("ping %s: %w", p.id, err)
	}
	select {
	case code := <-ch:
		if code == 482 {
			// The backend is this balancer, or one that sends its work back
			// here: whatever we sent it would come round again.
			s.metrics.PingsFailed.Add(1)
			return lb.ProbeDown, fmt.Errorf("ping %s: 482 loop detected: the backend sends requests back to this balancer", p.id)
		}
		return lb.ProbeUp, nil
	case <-ctx.Done():
		s.metrics.PingsFailed.Add(1)
		return lb.ProbeDown, fmt.Errorf("ping %s: no answer: %w", p.id, ctx.Err())
	}
}

func (s *Server) pingMessage(to target, branch string, seq uint64) []byte {
	host := s.adv.String()
	tr := s.viaTransport(to)
	p := make([]byte, 0, 384)
	p = append(p, "OPTIONS sip:"...)
	p = append(p, to.addr.String()...)
	p = append(p, " SIP/2.0\r\nVia: SIP/2.0/"...)
	p = append(p, tr...)
	p = append(p, ' ')
	p = append(p, host...)
	p = append(p, ";branch="...)
	p = append(p, branch...)
	p = append(p, "\r\nMax-Forwards: 70\r\nFrom: <sip:sluice@"...)
	p = append(p, host...)
	p = append(p, ">;tag="...)
	p = append(p, localTag()...)
	p = append(p, "\r\nTo: <sip:"...)
	p = append(p, to.addr.String()...)
	p = append(p, ">\r\nCall-ID: sluice-ping-"...)
	p = append(p, strconv.FormatUint(seq, 10)...)
	p = append(p, '@')
	p = append(p, host...)
	p = append(p, "\r\nCSeq: 1 OPTIONS\r\nAccept: application/sdp\r\nContent-Length: 0\r\n\r\n"...)
	return p
}

// pingAnswered handles the answer to a health ping. Only an answer from
// the address and transport the ping went to counts.
func (s *Server) pingAnswered(branch string, res *gosip.Response, src source) {
	s.pings.mu.Lock()
	w, ok := s.pings.m[branch]
	s.pings.mu.Unlock()
	if !ok || w.to.addr != src.addr || w.to.tcp != (src.conn != nil) {
		if ok {
			s.metrics.ForgedResponses.Add(1)
		} else {
			s.metrics.StrayResponses.Add(1)
		}
		return
	}
	if res.StatusCode < 200 {
		return
	}
	// Alive: in-dialog requests it left unanswered were lost or ignored,
	// not a sign of death (unansweredBy). A 482 is no such sign: the
	// backend sends what we send it back to us (a loop), and the ping
	// counts it down.
	if res.StatusCode != 482 {
		w.lbb.Served(s.clock.Now())
		if set := s.pool.Load(); set != nil {
			if b := set.of(w.lbb); b != nil {
				b.unanswered.Store(0)
			}
		}
	}
	if res.StatusCode == 503 {
		s.drainBackend(w.lbb, s.clock.Now(), s.retryAfter(res), "health ping answered 503")
	}
	select {
	case w.ch <- res.StatusCode:
	default:
	}
}

// retryAfter is a 503's Retry-After, or BusyDefault, at most lb.MaxAvoid
// (the cap HTTP's Retry-After has): one answer cannot keep a backend from
// new work for longer.
func (s *Server) retryAfter(res *gosip.Response) time.Duration {
	if h := res.GetHeader("retry-after"); h != nil {
		if n, err := strconv.ParseUint(firstToken(h.Value()), 10, 32); err == nil {
			return min(time.Duration(n)*time.Second, lb.MaxAvoid)
		}
	}
	return min(s.cfg.BusyDefault, lb.MaxAvoid)
}

// isPing reports whether req is a balancer's health ping (ours or another
// node's): its top Via branch has our ping prefix.
func (s *Server) isPing(req *gosip.Request) bool {
	br, _ := req.Via().Params.Get("branch")
	return strings.HasPrefix(br, pingBranchPrefix)
}

func firstToken(v string) string {
	if i := indexAny(v, " ;("); i >= 0 {
		return v[:i]
	}
	return v
}
