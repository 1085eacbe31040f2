package http

import (
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/lb"
)

// backendBusy handles a backend's 503: with a Retry-After (seconds or an
// HTTP date, RFC 9110 §10.2.3) the backend gets no new work for that long
// (lb.Backend.Avoid, capped at lb.MaxAvoid) while its sticky clients
// continue; without one the 503 only counts as a failure for passive
// ejection. The 503 itself is relayed to the client as the backend sent
// it.
func (s *Server) backendBusy(h *fasthttp.ResponseHeader, b *lb.Backend) {
	d, ok := parseRetryAfter(h.Peek("Retry-After"), s.wall(s.clock.Now()))
	if !ok {
		return
	}
	if b.Avoid(s.clock.Now(), d) {
		s.logger.Info("backend answered 503 with Retry-After: no new work to it meanwhile (sticky clients continue)",
			"backend", b.ID(), "retry_after", d.String(), "max", lb.MaxAvoid.String())
	}
}

// parseRetryAfter reads a Retry-After value: delay-seconds, or an
// HTTP-date taken against now. Zero, a date in the past or a value that
// is neither gives ok false.
func parseRetryAfter(v []byte, now time.Time) (time.Duration, bool) {
	if len(v) == 0 {
		return 0, false
	}
	if n, err := strconv.ParseUint(string(v), 10, 32); err == nil {
		return time.Duration(n) * time.Second, n > 0
	}
	t, err := fasthttp.ParseHTTPDate(v)
	if err != nil {
		return 0, false
	}
	d := t.Sub(now)
	return d, d > 0
}
