package http

import (
	"context"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/lb"
)

// Backends that answer every request in 2 s fail the default probe (GET
// /, 1 s timeout). The probes took them down and every request, sticky or
// new, got 503 while they answered all that reached them. Through the
// front end, on the rig's clock (each answer moves it 2 s): 0 refused,
// with the default panic threshold and with panic off (answers alone).
func TestSlowBackendsServedWhileProbesFail(t *testing.T) {
	for _, panic := range []float64{0, 1} {
		onEngines(t, func(t *testing.T) {
			r := newRig(t, rigOpts{backends: 2, passive: lb.PassiveConfig{MaxFails: 3, Cooldown: 10 * time.Second}})
			for _, be := range r.backends {
				be.handler = func(ctx *fasthttp.RequestCtx) {
					r.clock.Advance(2 * time.Second) // the answer takes 2 s
					ctx.SetBodyString(be.name)
				}
			}
			timedOut := lb.ProberFunc(func(context.Context, *lb.Backend) (lb.ProbeResult, error) {
				return lb.ProbeDown, context.DeadlineExceeded
			})
			h, err := lb.NewPoolHealthChecker(lb.HealthConfig{Clock: r.clock, Panic: panic}, r.pool,
				func(*lb.Backend) lb.Prober { return timedOut }, nil)
			if err != nil {
				t.Fatal(err)
			}
			cookie := stickyFrom(t, r.get("/", ""))
			refused := 0
			for range 12 { // a probe every interval (2 s), a new and a sticky request in it
				h.ProbeAll(context.Background())
				if rep := r.get("/", ""); rep.status != 200 {
					refused++
				}
				if rep := r.get("/", cookie); rep.status != 200 {
					refused++
				}
			}
			if refused != 0 {
				t.Errorf("panic %g: %d of 24 requests refused by backends answering every one", panic, refused)
			}
			if _, down := r.pool.Backends()[0].ProbeDownSince(); !down {
				t.Errorf("panic %g: the probes never took it down: the test proves nothing", panic)
			}
		})
	}
}
