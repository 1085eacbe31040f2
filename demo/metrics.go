package demo

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"
)

// HealthThreshold is the fraction of its maximum memory above which a
// backend's health endpoint answers 429, as Oracle Health Insurance's
// memory states do: "send no new work".
const HealthThreshold = 0.95

// MetricsHandler serves l's memory as Prometheus text (version 0.0.4):
//
//	jvm_memory_used_bytes{area="heap",id="demo"} Used
//	jvm_memory_max_bytes{area="heap",id="demo"} Max
//	demo_live_sessions Live
//
// plus counters of holds, holds over the maximum, refusals and expiries.
// The JVM gauge names are what MOP's memory probe reads by default. With
// the query ?format=json, or when the Accept header prefers
// application/json, it serves {"heap_used_bytes":Used,"heap_max_bytes":Max}
// instead.
func MetricsHandler(l *Ledger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := l.Stats()
		if wantsJSON(r) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"heap_used_bytes":%d,"heap_max_bytes":%d,"live_sessions":%d}`+"\n", s.Used, s.Max, s.Live)
			return
		}
		var b bytes.Buffer
		gauge(&b, "jvm_memory_used_bytes", "The amount of used memory", `{area="heap",id="demo"}`, s.Used)
		gauge(&b, "jvm_memory_max_bytes", "The maximum amount of memory that can be used for memory management", `{area="heap",id="demo"}`, s.Max)
		gauge(&b, "demo_live_sessions", "Sessions or dialogs holding memory now.", "", int64(s.Live))
		counter(&b, "demo_sessions_total", "Sessions or dialogs that were given memory.", s.Holds)
		counter(&b, "demo_sessions_over_max_total", "Sessions or dialogs given memory past the maximum.", s.OverMax)
		counter(&b, "demo_sessions_refused_total", "Sessions or dialogs refused because memory was exhausted.", s.Refused)
		counter(&b, "demo_sessions_expired_total", "Sessions or dialogs whose memory was released by expiry.", s.Expired)
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.Write(b.Bytes())
	})
}

func wantsJSON(r *http.Request) bool {
	if f := r.URL.Query().Get("format"); f != "" {
		return f == "json"
	}
	// A probe sends "text/plain;version=0.0.4, application/json;q=0.5":
	// only a client that names JSON first gets it without asking.
	accept := r.Header.Get("Accept")
	return len(accept) >= 16 && accept[:16] == "application/json"
}

func gauge(b *bytes.Buffer, name, help, labels string, v int64) {
	fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s gauge\n%s%s %s\n", name, help, name, name, labels, strconv.FormatInt(v, 10))
}

func counter(b *bytes.Buffer, name, help string, v uint64) {
	fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s counter\n%s %s\n", name, help, name, name, strconv.FormatUint(v, 10))
}

// HealthHandler answers 429 when l's used memory is above HealthThreshold
// of its maximum, else 200. The body names the state and the fraction.
func HealthHandler(l *Ledger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		used, max := l.Used(), l.Max()
		frac := float64(used) / float64(max)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if frac > HealthThreshold {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprintf(w, "memory high %.1f%%\n", 100*frac)
			return
		}
		fmt.Fprintf(w, "ok %.1f%%\n", 100*frac)
	})
}

// NewMetricsMux returns a mux serving MetricsHandler(l) at /metrics and
// HealthHandler(l) at /health, for a backend's metrics listener.
func NewMetricsMux(l *Ledger) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", MetricsHandler(l))
	mux.Handle("/health", HealthHandler(l))
	return mux
}
