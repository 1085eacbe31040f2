package node

import (
	"fmt"
	"net/http"
	"time"

	"github.com/sluicelb/sluice/admin"
	"github.com/sluicelb/sluice/admission"
)

// healthz is admin.Healthz (200 in memory state Normal, 429 otherwise),
// and 429 "draining" from the moment a drain starts, so that a balancer
// in front stops sending.
func (n *Node) healthz() http.Handler {
	mem := admin.Healthz(n.mem)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !n.ctrl.Draining() {
			mem.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("Retry-After", "5")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprintln(w, "draining")
	})
}

// inFlight is the new work and requests sent to backends and not yet
// answered, over every front end.
func (n *Node) inFlight() int64 {
	var sum int64
	for _, b := range n.backendStatus() {
		sum += b.Outstanding
	}
	return sum
}

// openTunnels counts the HTTP front end's open and pending tunnels.
func (n *Node) openTunnels() int64 {
	if n.httpSrv == nil {
		return 0
	}
	st := n.httpSrv.Stats()
	return st.Tunnels.Load() + st.TunnelsPending.Load()
}

// drainQuiet is how long a drain waits with nothing in flight and no
// affinity traffic before it ends early.
const drainQuiet = 2 * time.Second

// Drain is the shutdown drain: it refuses new work at once (health 429)
// and keeps serving in-flight requests, affinity traffic and open tunnels
// until nothing has been in flight, no tunnel has been open and no
// affinity request has come for drainQuiet, or until timeout (0: it does
// not wait). It returns the time left of
// timeout, at least a second, for Stop.
func (n *Node) Drain(timeout time.Duration) time.Duration {
	start := time.Now()
	n.ctrl.SetDraining(true)
	if n.sipSrv != nil {
		n.sipSrv.Drain()
	}
	if timeout <= 0 {
		n.logger.Info("no shutdown drain (-drain-timeout 0): new work refused, stopping")
		return time.Second
	}
	n.logger.Info("draining: new work refused, affinity and in-flight requests served", "timeout", timeout)
	affinity := func() (sum uint64) {
		c := n.ctrl.Counts()
		for i := range c.Admitted {
			sum += c.Admitted[i][admission.Affinity]
		}
		return sum
	}
	last, quietSince := affinity(), time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for range tick.C {
		if time.Since(start) >= timeout {
			if t := n.openTunnels(); t > 0 {
				n.logger.Warn("drain timeout reached: open tunnels are closed now", "in_flight", n.inFlight(), "tunnels", t)
			} else {
				n.logger.Warn("drain timeout reached", "in_flight", n.inFlight())
			}
			break
		}
		// An open tunnel (a WebSocket) is a session under way: the drain
		// gives it until the timeout rather than ending early around it.
		if a := affinity(); a != last || n.inFlight() > 0 || n.openTunnels() > 0 {
			last, quietSince = a, time.Now()
			continue
		}
		if time.Since(quietSince) >= drainQuiet {
			n.logger.Info("drained", "after", time.Since(start).Round(time.Millisecond))
			break
		}
	}
	return max(timeout-time.Since(start), time.Second)
}
