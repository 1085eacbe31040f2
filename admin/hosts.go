package admin

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// The admin listener answers only requests whose Host is a name the
// operator meant: a page of another site whose name an attacker points at
// 127.0.0.1 (DNS rebinding) is, for the browser, the same origin as the
// admin listener, so neither the origin check of the control endpoints nor
// CORS stops it; its Host header still carries the attacker's name. Every
// path (/healthz and /metrics too) answers 421 Misdirected Request to a
// Host that is not:
//
//   - localhost or a loopback address (127.0.0.0/8, ::1), with the port the
//     connection arrived on;
//   - the address the connection arrived on (an IP literal: what a
//     Prometheus scraper or a load balancer's probe given the address
//     sends), with its port;
//   - the host of -admin-listen as written, with the port;
//   - a name of -admin-host: NAME with any port, NAME:PORT with that port.
//
// A missing Host is refused too. IP literals are safe to accept: a
// rebinding attack needs a name the attacker controls.

// HostRule is one -admin-host value: a name, with a port or not.
type HostRule struct {
	Host string // lower case, no brackets
	Port string // "" for any port
}

// ParseHost parses an -admin-host value: NAME, NAME:PORT, an IP address
// or [IPv6]:PORT. No scheme, path or wildcard.
func ParseHost(s string) (HostRule, error) {
	v := strings.TrimSpace(s)
	if v == "" {
		return HostRule{}, fmt.Errorf("%q: want a host name, NAME:PORT or an IP address", s)
	}
	if strings.ContainsAny(v, "/*@ \t?#") {
		return HostRule{}, fmt.Errorf("%q: want a host name as the Host header carries it (NAME or NAME:PORT), no scheme, path or wildcard", s)
	}
	host, port, ok := splitHost(v, "")
	if !ok || host == "" {
		return HostRule{}, fmt.Errorf("%q: want a host name, NAME:PORT or an IP address", s)
	}
	if port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return HostRule{}, fmt.Errorf("%q: port %q: want 1 to 65535", s, port)
		}
	}
	for _, r := range host {
		if !(r == '.' || r == '-' || r == '_' || r == ':' || r == '%' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9')) {
			return HostRule{}, fmt.Errorf("%q: %q is not allowed in a host name", s, r)
		}
	}
	return HostRule{Host: host, Port: port}, nil
}

// splitHost splits a Host header value into a lower-case host (IPv6
// without brackets) and a port; without a port it gives defPort. ok is
// false for what no client sends as a Host ("::1" without brackets,
// "name:" with an empty port).
func splitHost(h, defPort string) (host, port string, ok bool) {
	if h == "" {
		return "", "", false
	}
	if hp, p, err := net.SplitHostPort(h); err == nil {
		if p == "" || hp == "" {
			return "", "", false
		}
		return strings.ToLower(hp), p, true
	}
	if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		return strings.ToLower(h[1 : len(h)-1]), defPort, true
	}
	if strings.Contains(h, ":") {
		return "", "", false
	}
	return strings.ToLower(h), defPort, true
}

// hostPolicy is what the listener answers to.
type hostPolicy struct {
	listenHost string // host of -admin-listen as written, lower case; "" for none or an unspecified address
	listenPort string // port of -admin-listen; used when a request carries no local address
	rules      []HostRule
}

// AllowHosts sets the Host names the listener answers to besides
// localhost, the loopback addresses and the address a request arrived on:
// listen is -admin-listen (its host, when not an unspecified address such
// as 0.0.0.0, is allowed with its port), names are -admin-host values.
// Call it before Serve.
func (s *Server) AllowHosts(listen string, names []string) error {
	p := &hostPolicy{}
	if listen != "" {
		h, port, err := net.SplitHostPort(listen)
		if err != nil {
			return fmt.Errorf("-admin-listen %q: %w", listen, err)
		}
		if ip := net.ParseIP(h); h != "" && (ip == nil || !ip.IsUnspecified()) {
			p.listenHost = strings.ToLower(h)
		}
		if port != "0" {
			p.listenPort = port
		}
	}
	for _, n := range names {
		r, err := ParseHost(n)
		if err != nil {
			return fmt.Errorf("-admin-host %w", err)
		}
		p.rules = append(p.rules, r)
	}
	s.hosts.Store(p)
	return nil
}

// allows reports whether host:port (from the Host header) is one the
// listener answers to, for a connection that arrived on local (nil when
// the request came from no connection; servePort then stands for its
// port).
func (p *hostPolicy) allows(host, port string, local net.Addr, servePort string) bool {
	for _, r := range p.rules {
		if r.Host == host && (r.Port == "" || r.Port == port) {
			return true
		}
	}
	lport := servePort
	if lport == "" {
		lport = p.listenPort
	}
	var lip net.IP
	if a, ok := local.(*net.TCPAddr); ok {
		lport, lip = strconv.Itoa(a.Port), a.IP
	}
	if lport == "" || port != lport {
		return false
	}
	if host == "localhost" {
		return true
	}
	if ip := net.ParseIP(host); ip != nil && (ip.IsLoopback() || (lip != nil && !ip.IsUnspecified() && ip.Equal(lip))) {
		return true
	}
	return p.listenHost != "" && host == p.listenHost
}

// maxLoggedSources bounds the sources whose first misdirected request is
// logged: a flood of sources costs a fixed amount of memory.
const maxLoggedSources = 1024

// misdirected counts and logs requests refused for their Host.
type misdirected struct {
	count  atomic.Uint64
	mu     sync.Mutex
	logged map[string]struct{}
	full   bool
}

// checkHost answers 421 and returns false when r's Host is not one the
// listener answers to.
func (s *Server) checkHost(w http.ResponseWriter, r *http.Request) bool {
	p := s.hosts.Load()
	if p == nil {
		p = &hostPolicy{}
	}
	local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	servePort := ""
	if n := s.servePort.Load(); n > 0 {
		servePort = strconv.Itoa(int(n))
	}
	host, port, ok := splitHost(r.Host, "80")
	if ok && p.allows(host, port, local, servePort) {
		return true
	}
	s.refuseHost(r)
	w.Header().Set("Connection", "close")
	http.Error(w, fmt.Sprintf("misdirected request: Host %q is not a name this admin listener answers to; use the address it listens on, localhost, or a name given with -admin-host", r.Host), http.StatusMisdirectedRequest)
	return false
}

// refuseHost counts a misdirected request and logs the first from each
// source (remote IP).
func (s *Server) refuseHost(r *http.Request) {
	m := &s.misdirected
	m.count.Add(1)
	src, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		src = r.RemoteAddr
	}
	m.mu.Lock()
	_, seen := m.logged[src]
	first, full := false, false
	if !seen && !m.full {
		if m.logged == nil {
			m.logged = map[string]struct{}{}
		}
		if len(m.logged) >= maxLoggedSources {
			m.full, full = true, true
		} else {
			m.logged[src] = struct{}{}
			first = true
		}
	}
	m.mu.Unlock()
	switch {
	case first:
		s.logger.Warn("admin request for a Host this listener does not answer to refused (421): a DNS rebinding attempt, or a name missing from -admin-host; further ones from this source are only counted",
			"remote", r.RemoteAddr, "host", r.Host, "method", r.Method, "path", r.URL.Path)
	case full:
		s.logger.Warn("misdirected admin requests from more sources than are logged: further sources are only counted (sluice_admin_misdirected_total)", "sources", maxLoggedSources)
	}
}

// Misdirected returns how many requests were refused 421 for their Host.
func (s *Server) Misdirected() uint64 { return s.misdirected.count.Load() }

var descMisdirected = prometheus.NewDesc("sluice_admin_misdirected_total",
	"Admin listener requests refused 421 because their Host is not a name the listener answers to (DNS rebinding guard, -admin-host).", nil, nil)

// Collector returns the admin listener's metrics for /metrics.
func (s *Server) Collector() prometheus.Collector { return adminCollector{s} }

type adminCollector struct{ s *Server }

func (c adminCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descMisdirected }

func (c adminCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descMisdirected, prometheus.CounterValue, float64(c.s.Misdirected()))
}
