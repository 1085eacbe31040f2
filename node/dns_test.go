package node

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/discovery/dnsmasqtest"
	"github.com/sluicelb/sluice/lb"
)

// loopBackends starts an HTTP backend on each 127.0.0.N (N in ips) on
// one port, each answering its own address; they stop at the test's end.
func loopBackends(t *testing.T, ips ...int) int {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.%d:0", ips[0]))
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		ls := []net.Listener{l}
		for _, ip := range ips[1:] {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.%d:%d", ip, port))
			if err != nil {
				break
			}
			ls = append(ls, l)
		}
		if len(ls) != len(ips) {
			for _, l := range ls {
				l.Close()
			}
			continue
		}
		for _, l := range ls {
			addr := l.Addr().String()
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/metrics" {
					memoryReport(w, r)
					return
				}
				io.WriteString(w, addr)
			})}
			go srv.Serve(l)
			t.Cleanup(func() { srv.Close() })
		}
		return port
	}
	t.Fatal("no common free port on the loopback addresses")
	return 0
}

func hostsOf(name string, ips ...int) string {
	var b strings.Builder
	for _, ip := range ips {
		fmt.Fprintf(&b, "127.0.0.%d %s\n", ip, name)
	}
	return b.String()
}

// members returns the addresses of the pool's backends, gone ones with a
// "~" before them.
func members(g *lb.Generation) []string {
	var out []string
	for _, b := range g.Pool(lb.DefaultPool).Backends() {
		s := b.Addr()
		if b.Gone() {
			s = "~" + s
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

type dnsEvents struct {
	mu  sync.Mutex
	all []admission.Event
}

func (e *dnsEvents) kinds(kind admission.EventKind) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, ev := range e.all {
		if ev.Kind == kind {
			out = append(out, ev.Message)
		}
	}
	return out
}

// TestDNSPoolScales: an HTTP pool from dns:app.test:PORT follows a real
// dnsmasq from 2 to 5 to 1 addresses under wrk's load (keep-alive
// connections, new work) and beside it clients with sticky cookies, all
// along: no request fails (no socket error, no answer but 200 in wrk's
// summary or the clients'), the new addresses take work once probed,
// vanished ones drain (sticky sessions finish there) and go, and
// sessions on surviving backends never move. Then the resolver stops:
// the pool and its traffic do not change. wrk runs at most 90 s and is
// stopped by its pid when the changes are over.
func TestDNSPoolScales(t *testing.T) {
	port := loopBackends(t, 1, 2, 3, 4, 5)
	addr := func(ip int) string { return fmt.Sprintf("127.0.0.%d:%d", ip, port) }
	dnsd := dnsmasqtest.Start(t, 0, nil, hostsOf("app.test", 1, 2))

	cfg := testConfig(t)
	cfg.HTTPBackends = []string{fmt.Sprintf("dns:app.test:%d", port)}
	cfg.HTTP.MaxConns = 256 // a source holds an eighth: the 8 clients share one address
	cfg.Health.Interval = 500 * time.Millisecond
	cfg.Health.Timeout = 500 * time.Millisecond // wrk keeps the cores busy: a probe may wait for one
	cfg.DNS = DNSConfig{Server: dnsd.Addr, MinTTL: 100 * time.Millisecond, MaxTTL: time.Second, KeepStale: 300 * time.Millisecond,
		Drain: 500 * time.Millisecond, Timeout: 200 * time.Millisecond}
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	var evs dnsEvents
	inner := n.events
	n.events = func(e admission.Event) { evs.mu.Lock(); evs.all = append(evs.all, e); evs.mu.Unlock(); inner(e) }
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer n.Stop(time.Second)
	if got := members(n.Generation("http")); !slices.Equal(got, []string{addr(1), addr(2)}) {
		t.Fatalf("start: members %v", got)
	}
	front := "http://" + n.Addrs().HTTP.String() + "/"

	// Load: 6 sticky sessions (cookie jars) and 2 clients without
	// cookies, each a request at a time, until stopped.
	var failed, total atomic.Int64
	var mu sync.Mutex
	served := map[int][]string{} // session -> backends in order
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
			if c < 6 {
				client.Jar, _ = cookiejar.New(nil)
			}
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := client.Get(front)
				total.Add(1)
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("%d %s", resp.StatusCode, body))
					continue
				}
				if c < 6 {
					mu.Lock()
					if s := served[c]; len(s) == 0 || s[len(s)-1] != string(body) {
						served[c] = append(s, string(body))
					}
					mu.Unlock()
				}
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	servedBy := func() map[string]bool {
		out := map[string]bool{}
		for _, b := range n.Generation("http").Backends() {
			if b.Status(0).Requests > 0 {
				out[b.Addr()] = true
			}
		}
		return out
	}
	load := startWrk(t, front, "-t1", "-c4", "-d90s", "--timeout", "5s")
	time.Sleep(300 * time.Millisecond)

	// 2 -> 5: the three new addresses are probed and take new work.
	dnsd.SetHosts(hostsOf("app.test", 1, 2, 3, 4, 5), "app.test", "127.0.0.5")
	waitFor(t, 20*time.Second, "5 members", func() bool { return len(members(n.Generation("http"))) == 5 })
	waitFor(t, 20*time.Second, "the new members to serve", func() bool { s := servedBy(); return s[addr(3)] && s[addr(4)] && s[addr(5)] })

	// 5 -> 1: four drain, then go.
	dnsd.SetHosts(hostsOf("app.test", 1), "", "")
	waitFor(t, 20*time.Second, "four members draining", func() bool {
		return slices.Equal(members(n.Generation("http")), []string{addr(1), "~" + addr(2), "~" + addr(3), "~" + addr(4), "~" + addr(5)})
	})
	waitFor(t, 20*time.Second, "the drained members to go", func() bool {
		return slices.Equal(members(n.Generation("http")), []string{addr(1)})
	})
	time.Sleep(200 * time.Millisecond)

	// The resolver goes away for a while (many -dns-min-ttl, past
	// -dns-keep-stale): the name is its pool's only source, so its last
	// addresses stay and traffic goes on.
	before := n.Generation("http")
	dnsd.Stop()
	waitFor(t, 20*time.Second, "a dns.stale event", func() bool { return len(evs.kinds(EventDNSStale)) > 0 })
	if m := evs.kinds(EventDNSStale)[0]; !strings.Contains(m, "past it while the name is the only source of one of its pools") {
		t.Errorf("dns.stale of a pool's only source: %q, want it said the answer is kept past -dns-keep-stale", m)
	}
	time.Sleep(time.Second) // many -dns-min-ttl, past -dns-keep-stale
	if got := members(n.Generation("http")); !slices.Equal(got, []string{addr(1)}) {
		t.Errorf("resolver down: members %v, want the last answer", got)
	}
	if n.Generation("http") != before {
		t.Error("resolver down: the generation was rebuilt")
	}
	summary, ranOut := load.stop(t)
	close(stop)
	wg.Wait()

	reqs, failures := wrkResult(summary)
	switch {
	case ranOut:
		t.Errorf("wrk's 90 s were over before the pool's changes:\n%s", summary)
	case reqs < 100:
		t.Errorf("wrk completed %d requests: the load did not run:\n%s", reqs, summary)
	case failures != "":
		t.Errorf("wrk saw failures while the pool changed: %s\n%s", failures, summary)
	}
	t.Logf("wrk: %d requests while the pool went 2 -> 5 -> 1 and the resolver stopped", reqs)
	if f := failed.Load(); f != 0 {
		t.Errorf("%d of %d requests failed (first: %v)", f, total.Load(), firstErr.Load())
	}
	if total.Load() < 100 {
		t.Errorf("only %d requests: the load did not run", total.Load())
	}
	// A session pinned to a backend that survived never moved; one
	// pinned to a vanished backend moved once, to a survivor.
	for c, s := range served {
		if s[0] == addr(1) && len(s) != 1 {
			t.Errorf("session %d on the surviving backend moved: %v", c, s)
		}
		if len(s) > 2 || s[len(s)-1] != addr(1) {
			t.Errorf("session %d: backends %v, want at most one move, to %s", c, s, addr(1))
		}
	}
	changes := evs.kinds(EventDNSChanged)
	// (The first answer's event, "added 2", came in New.)
	want := []string{"added 3, removed 0, unchanged 2", "added 0, removed 4, unchanged 1"}
	if len(changes) != len(want) {
		t.Fatalf("dns.changed events %q, want %d", changes, len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(changes[i], w) {
			t.Errorf("event %d: %q, want %q...", i, changes[i], w)
		}
	}
}

// fakeClock is the DNS loop's wall clock in a test: it moves only when
// told.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

// advance moves the clock of n's DNS loop on by d and returns once a
// round of the loop has run entirely after the move (its changes in
// force).
func (c *fakeClock) advance(t *testing.T, n *Node, d time.Duration) {
	t.Helper()
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
	r0 := n.dns.rounds.Load()
	waitFor(t, 20*time.Second, "two rounds of the DNS loop", func() bool {
		select {
		case n.dns.kick <- struct{}{}:
		default:
		}
		return n.dns.rounds.Load() >= r0+2
	})
}

// TestDNSKeepStale, on an injected clock: a name that turns NXDOMAIN
// keeps its last addresses for -dns-keep-stale, then they drain for
// -dns-drain and go, when another backend serves its pool; a name that
// answers again comes back, with the MOP state it had learned (MOP is
// keyed by address).
func TestDNSKeepStale(t *testing.T) {
	port := loopBackends(t, 1, 2)
	addr := func(ip int) string { return fmt.Sprintf("127.0.0.%d:%d", ip, port) }
	dnsd := dnsmasqtest.Start(t, 0, nil, hostsOf("app.test", 2))
	cfg := testConfig(t)
	cfg.HTTPBackends = []string{addr(1), fmt.Sprintf("dns:app.test:%d,metrics=http://{host}:%d/metrics", port, port)}
	cfg.DNS = DNSConfig{Server: dnsd.Addr, MinTTL: time.Second, MaxTTL: time.Minute, KeepStale: 10 * time.Second,
		Drain: 5 * time.Second, Timeout: time.Second}
	cfg.AdminListen = "127.0.0.1:0"
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	clock := &fakeClock{t: time.Now()}
	n.dns.now = clock.Now
	var evs dnsEvents
	inner := n.events
	n.events = func(e admission.Event) { evs.mu.Lock(); evs.all = append(evs.all, e); evs.mu.Unlock(); inner(e) }
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer n.Stop(time.Second)
	if got := members(n.Generation("http")); !slices.Equal(got, []string{addr(1), addr(2)}) {
		t.Fatalf("start: %v", got)
	}
	rc := n.RunningConfig()
	tpl := fmt.Sprintf("\nhttp-backend dns:app.test:%d,metrics=http://{host}:%d/metrics\n", port, port)
	if !strings.Contains(rc, tpl) || !strings.Contains(rc, "\nhttp-backend "+addr(1)+"\n") || strings.Contains(rc, addr(2)) {
		t.Errorf("running configuration: want the name, not its addresses:\n%s", rc)
	}
	mop := n.Generation("http").Lookup(addr(2)).MOP()
	waitFor(t, 20*time.Second, "MOP to learn from the probe", func() bool { return mop.Status().Phase == admission.Learned })

	dnsd.SetHosts("127.0.0.9 other.test\n", "other.test", "127.0.0.9")
	steps := []struct {
		advance time.Duration
		want    []string
	}{
		{time.Second, []string{addr(1), addr(2)}},           // NXDOMAIN: stale, kept
		{8 * time.Second, []string{addr(1), addr(2)}},       // 9s since the last answer
		{2 * time.Second, []string{addr(1), "~" + addr(2)}}, // 11s: past -dns-keep-stale, draining
		{4 * time.Second, []string{addr(1), "~" + addr(2)}}, // 4s of the 5s drain
		{2 * time.Second, []string{addr(1)}},                // drained: gone
	}
	for i, s := range steps {
		clock.advance(t, n, s.advance)
		if got := members(n.Generation("http")); !slices.Equal(got, s.want) {
			t.Fatalf("step %d (+%s): members %v, want %v", i, s.advance, got, s.want)
		}
	}
	if st := evs.kinds(EventDNSStale); len(st) != 1 || !strings.Contains(st[0], "stays in force for -dns-keep-stale 10s: ") {
		t.Errorf("dns.stale events %q, want one that says the answer stays for -dns-keep-stale (another backend serves the pool)", st)
	}
	dnsd.SetHosts(hostsOf("app.test", 2), "app.test", "127.0.0.2")
	clock.advance(t, n, time.Second)
	if got := members(n.Generation("http")); !slices.Equal(got, []string{addr(1), addr(2)}) {
		t.Fatalf("back: members %v", got)
	}
	if back := n.Generation("http").Lookup(addr(2)).MOP(); back != mop || back.Status().Phase != admission.Learned {
		t.Errorf("the address came back with another MOP state (%p, was %p) or unlearned", back, mop)
	}
	metrics := getBody(t, "http://"+n.Addrs().Admin.String()+"/metrics")
	name := fmt.Sprintf(`name="dns:app.test:%d",protocol="http"`, port)
	for _, want := range []string{
		"sluice_dns_addresses{" + name + "} 1\n",
		"sluice_dns_draining{" + name + "} 0\n",
		"sluice_dns_stale{" + name + "} 0\n",
		"sluice_dns_lookups_total{" + name + `,result="not_found"} 5` + "\n",
		"sluice_dns_lookups_total{" + name + `,result="ok"} 2` + "\n",
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, metrics[strings.Index(metrics, "sluice_dns"):])
		}
	}
}

// TestDNSStartErrors: a name without addresses at start is refused when
// it leaves a pool empty, naming the name; a bad -dns-* value names its
// flag.
func TestDNSStartErrors(t *testing.T) {
	dnsd := dnsmasqtest.Start(t, 0, nil, "")
	cfg := testConfig(t)
	cfg.HTTPBackends = []string{"dns:nothing.test:80"}
	cfg.DNS = DNSConfig{Server: dnsd.Addr, Timeout: 2 * time.Second}
	// The error names the backend spec, the pool left empty and the
	// resolver asked: what an operator checks first.
	if _, err := New(cfg, nil); err == nil || !strings.HasPrefix(err.Error(), "http backend dns:nothing.test:80: no address from DNS (") || !strings.Contains(err.Error(), "NXDOMAIN") ||
		!strings.HasSuffix(err.Error(), "), and no other backend in pool default: check the name and the resolver (-dns-server "+dnsd.Addr+"), or give the pool another backend") {
		t.Errorf("empty pool at start: %v", err)
	}
	for _, c := range []struct {
		dns  DNSConfig
		want string
	}{
		{DNSConfig{MinTTL: time.Millisecond}, "-dns-min-ttl 1ms"},
		{DNSConfig{Drain: -time.Second}, "-dns-drain -1s"},
		{DNSConfig{Server: "1.2.3.4:0"}, `-dns-server "1.2.3.4:0"`},
		{DNSConfig{Family: "inet4"}, `-dns-family "inet4": want one of any, ipv4, ipv6`},
	} {
		cfg := testConfig(t)
		cfg.HTTPBackends = []string{"127.0.0.1:1"}
		cfg.DNS = c.dns
		if _, err := New(cfg, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.dns, err, c.want)
		}
	}
}

// TestHTTPSRV: srv:NAME for HTTP asks _http._tcp.NAME; the SRV priority
// puts the lower backend first, and only it takes work while it is up.
func TestHTTPSRV(t *testing.T) {
	port := loopBackends(t, 1, 2)
	conf := []string{
		fmt.Sprintf("srv-host=_http._tcp.web.test,a.web.test,%d,10,5", port),
		fmt.Sprintf("srv-host=_http._tcp.web.test,b.web.test,%d,20,5", port),
	}
	dnsd := dnsmasqtest.Start(t, 60, conf, "127.0.0.1 a.web.test\n127.0.0.2 b.web.test\n")
	cfg := testConfig(t)
	cfg.HTTPBackends = []string{"srv:web.test"}
	cfg.DNS = DNSConfig{Server: dnsd.Addr}
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer n.Stop(time.Second)
	a, b := fmt.Sprintf("127.0.0.1:%d", port), fmt.Sprintf("127.0.0.2:%d", port)
	g := n.Generation("http")
	if got := members(g); !slices.Equal(got, []string{a, b}) || g.Lookup(a).Priority() != 10 || g.Lookup(b).Priority() != 20 || g.Lookup(a).Weight() != 5 {
		t.Fatalf("members %v", got)
	}
	for range 5 {
		if body := getBody(t, "http://"+n.Addrs().HTTP.String()+"/"); body != a {
			t.Fatalf("served by %q, want the priority 10 backend %s", body, a)
		}
	}
	g.Lookup(a).Disable(true)
	if body := getBody(t, "http://"+n.Addrs().HTTP.String()+"/"); body != b {
		t.Fatalf("priority 10 out: served by %q, want %s", body, b)
	}
}

// TestDNSStartSelfOnly: a name whose every address is one of the node's
// own listeners leaves its pool without backends; start-up says that (the
// name, its addresses, the pool, that it leads back to sluice), where it
// said "http backends: pool has no backends: invalid backend
// configuration" beside a log line the operator had to find.
func TestDNSStartSelfOnly(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dnsd := dnsmasqtest.Start(t, 0, nil, hostsOf("self.test", 1))
	cfg := testConfig(t)
	cfg.HTTP.Listen = fmt.Sprintf("127.0.0.1:%d", port)
	cfg.HTTPBackends = []string{fmt.Sprintf("dns:self.test:%d", port)}
	cfg.DNS = DNSConfig{Server: dnsd.Addr, Timeout: 2 * time.Second}
	want := fmt.Sprintf("http backend dns:self.test:%d: every address DNS gives (127.0.0.1:%d) is a listener of this node, no backend, and no other backend in pool default: the name leads back to sluice", port, port)
	if n, err := New(cfg, nil); err == nil || !strings.HasPrefix(err.Error(), want) {
		if n != nil {
			n.Stop(time.Second)
		}
		t.Errorf("start with a name that is the node itself: %v\nwant an error starting %q", err, want)
	}
	// Another backend in the pool: the node starts, without the name's address.
	cfg.HTTPBackends = append(cfg.HTTPBackends, "127.0.0.1:1")
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatalf("with another backend in the pool: %v", err)
	}
	n.Stop(time.Second)
}
