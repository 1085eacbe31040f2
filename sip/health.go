package sip

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	gosip "github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/lb"
)

// pingTable holds the OPTIONS health probes in flight, keyed by branch.
type pingTable struct {
	mu  sync.Mutex
	m   map[string]chan int
	seq uint64
}

func (pt *pingTable) init() { pt.m = map[string]chan int{} }

// optionsProber is the SIP health check (RFC 3261 §11): an OPTIONS to the
// backend. Any answer means up; a 503 also drains the backend for its
// Retry-After; silence until the probe's deadline means down. Rise/fall
// counting is lb.HealthChecker's. p is the pool whose backends it pings.
type optionsProber struct {
	s *Server
	p *pool
}

var _ lb.Prober = optionsProber{}

// Probe implements lb.Prober.
func (p optionsProber) Probe(ctx context.Context, lbb *lb.Backend) (lb.ProbeResult, error) {
	s := p.s
	b := p.p.list[lbb.Index()]
	s.pings.mu.Lock()
	s.pings.seq++
	seq := s.pings.seq
	branch := pingBranchPrefix + strconv.FormatUint(seq, 36) + "x" + strconv.FormatUint(fastRand()&0xffffffff, 36)
	ch := make(chan int, 1)
	s.pings.m[branch] = ch
	s.pings.mu.Unlock()
	defer func() {
		s.pings.mu.Lock()
		delete(s.pings.m, branch)
		s.pings.mu.Unlock()
	}()
	s.metrics.PingsSent.Add(1)
	if err := s.sendBytes(s.pingMessage(b, branch, seq), target{addr: b.addr, tcp: b.tcp}); err != nil {
		s.metrics.PingsFailed.Add(1)
		return lb.ProbeDown, fmt.Errorf("ping %s: %w", b.id, err)
	}
	select {
	case <-ch:
		return lb.ProbeUp, nil
	case <-ctx.Done():
		s.metrics.PingsFailed.Add(1)
		return lb.ProbeDown, fmt.Errorf("ping %s: no answer: %w", b.id, ctx.Err())
	}
}

func (s *Server) pingMessage(b *backend, branch string, seq uint64) []byte {
	host := s.adv.String()
	p := make([]byte, 0, 384)
	p = append(p, "OPTIONS sip:"...)
	p = append(p, b.addr.String()...)
	p = append(p, " SIP/2.0\r\nVia: SIP/2.0/"...)
	p = append(p, b.transport()...)
	p = append(p, ' ')
	p = append(p, host...)
	p = append(p, ";branch="...)
	p = append(p, branch...)
	p = append(p, "\r\nMax-Forwards: 70\r\nFrom: <sip:sluice@"...)
	p = append(p, host...)
	p = append(p, ">;tag="...)
	p = append(p, localTag()...)
	p = append(p, "\r\nTo: <sip:"...)
	p = append(p, b.addr.String()...)
	p = append(p, ">\r\nCall-ID: sluice-ping-"...)
	p = append(p, strconv.FormatUint(seq, 10)...)
	p = append(p, '@')
	p = append(p, host...)
	p = append(p, "\r\nCSeq: 1 OPTIONS\r\nAccept: application/sdp\r\nContent-Length: 0\r\n\r\n"...)
	return p
}

// pingAnswered handles the answer to a health ping.
func (s *Server) pingAnswered(branch string, res *gosip.Response, src source) {
	s.pings.mu.Lock()
	ch, ok := s.pings.m[branch]
	s.pings.mu.Unlock()
	if !ok || res.StatusCode < 200 {
		return
	}
	if b := s.pool.Load().byAddr[src.addr]; b != nil {
		// Alive: in-dialog requests it left unanswered were lost or
		// ignored, not a sign of death (unansweredBy).
		b.lb.Served(s.clock.Now())
		b.unanswered.Store(0)
		if res.StatusCode == 503 {
			b.drain(s.clock.Now(), s.retryAfter(res))
		}
	}
	select {
	case ch <- res.StatusCode:
	default:
	}
}

// retryAfter is a 503's Retry-After, or DrainDefault.
func (s *Server) retryAfter(res *gosip.Response) time.Duration {
	if h := res.GetHeader("retry-after"); h != nil {
		if n, err := strconv.Atoi(firstToken(h.Value())); err == nil && n >= 0 && n < 86400 {
			return time.Duration(n) * time.Second
		}
	}
	return s.cfg.DrainDefault
}

func firstToken(v string) string {
	if i := indexAny(v, " ;("); i >= 0 {
		return v[:i]
	}
	return v
}
