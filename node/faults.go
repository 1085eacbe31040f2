package node

import (
	"fmt"
	"strings"
	"time"

	"github.com/sluicelb/sluice/admission"
	lbhttp "github.com/sluicelb/sluice/http"
	"github.com/sluicelb/sluice/lb"
)

// httpProber is the active health check of an HTTP backend: its own
// health=PATH wins (spec.Prober), then -health-path (2xx/3xx up, 429
// busy), else GET / where any answer below 500 proves the backend alive:
// unlike a TCP connect it fails on a backend that accepts connections and
// never answers. -health-path - keeps the TCP connect alone (for a backend
// whose / is costly; it passes a hung backend).
func httpProber(flagPath string, spec lbhttp.BackendSpec) lb.Prober {
	switch {
	case spec.HealthPath != "" || flagPath == "":
		return spec.Prober()
	case flagPath == "-":
		return lb.TCPProber{}
	}
	return lb.HTTPProber{Path: flagPath}
}

// checkHealthPath accepts "", "-" or an absolute path.
func checkHealthPath(p string) error {
	if p == "" || p == "-" || strings.HasPrefix(p, "/") && !strings.ContainsAny(p, " \t\r\n#") {
		return nil
	}
	return fmt.Errorf("-health-path %q: want an absolute path such as /healthz, or - for a TCP connect only", p)
}

// onEject logs a passive ejection and records it as a backend.state
// event: the line an operator finds when a backend stops getting traffic.
func (n *Node) onEject(proto string) func(b *lb.Backend, r lb.Result, until int64) {
	return func(b *lb.Backend, r lb.Result, until int64) {
		d := time.Duration(until - n.clock.Now()).Round(time.Millisecond)
		attrs := []any{"protocol", proto, "backend", b.ID(), "last_failure", r.String(), "for", d}
		last := r.String()
		if e := b.LastProbeError(); e != "" {
			// The health checks' error names the cause the category
			// hides (an x509 failure is a "connect error").
			attrs = append(attrs, "health_check_error", e)
			last += "; its health checks: " + e
		}
		n.logger.Warn("backend ejected", attrs...)
		if n.events != nil {
			n.events(admission.Event{Time: time.Now(), Kind: admission.EventBackendState, Subject: proto + " " + b.ID(),
				Message: fmt.Sprintf("backend %s ejected for %v after consecutive failures (the last: %s); -health-max-fails, -health-cooldown", b.ID(), d, last)})
		}
	}
}
