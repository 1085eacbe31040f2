package node

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/sluicelb/sluice/discovery"
)

// flappingDNS is a DNS server on loopback whose every A answer is a new
// set of per addresses (127.N.0.1.., N the answer's number) with a TTL of
// 1 s, and whose AAAA answers are empty.
func flappingDNS(t *testing.T, per int) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var answers atomic.Int32
	h := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		m.Compress = true
		if q.Question[0].Qtype == dns.TypeA {
			k := answers.Add(1)
			for i := range per {
				rr, _ := dns.NewRR(fmt.Sprintf("%s 1 IN A 127.%d.%d.%d", q.Question[0].Name, k%250+1, i/250, i%250+1))
				m.Answer = append(m.Answer, rr)
			}
		}
		w.WriteMsg(m)
	})
	srv := &dns.Server{PacketConn: pc, Handler: h}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go srv.ActivateAndServe()
	<-started
	t.Cleanup(func() { srv.Shutdown() })
	return pc.LocalAddr().String()
}

// TestHostileDNSFlapping: a name whose every answer is a new set of
// addresses (a hostile or broken zone, a TTL of 1 s) under a long
// -dns-drain. Each vanished address drains for -dns-drain: unbounded,
// the draining addresses grow by a whole answer per lookup (memory
// without bound), and once they pass lb.MaxBackends no generation can be
// built, so no later answer is ever put in force. The draining addresses
// of a name are bounded (discovery.MaxTargets, those due first go
// first), and the newest answer is always in force.
func TestHostileDNSFlapping(t *testing.T) {
	const per = 60
	port := loopBackends(t, 1)
	cfg := testConfig(t)
	cfg.HTTPBackends = []string{fmt.Sprintf("127.0.0.1:%d", port), "dns:flap.test:9"}
	cfg.DNS = DNSConfig{Server: flappingDNS(t, per), MinTTL: time.Second, MaxTTL: time.Minute, KeepStale: time.Hour,
		Drain: time.Hour, Timeout: time.Second}
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	clock := &fakeClock{t: time.Now()}
	n.dns.now = clock.Now
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer n.Stop(time.Second)
	for round := range 12 {
		clock.advance(t, n, time.Second)
		n.dns.mu.Lock()
		var gone int
		var want []string
		for _, nm := range n.dns.names {
			gone += len(nm.gone)
			for _, tg := range nm.tr.Targets() {
				want = append(want, tg.Addr.String())
			}
		}
		n.dns.mu.Unlock()
		if gone > discovery.MaxTargets {
			t.Fatalf("round %d: %d addresses draining, want at most %d", round, gone, discovery.MaxTargets)
		}
		var live []string
		for _, m := range members(n.Generation("http")) {
			if !strings.HasPrefix(m, "~") && !strings.HasPrefix(m, "127.0.0.1:") {
				live = append(live, m)
			}
		}
		slices.Sort(want)
		if len(want) != per || strings.Join(live, " ") != strings.Join(want, " ") {
			t.Fatalf("round %d: the last answer is not in force:\n got %v\nwant %v", round, live, want)
		}
	}
}

// zoneDNS is a DNS server on loopback answering from a fixed zone
// (records in zone file syntax, full names), on UDP.
func zoneDNS(t *testing.T, records ...string) string {
	t.Helper()
	var rrs []dns.RR
	for _, s := range records {
		rr, err := dns.NewRR(s)
		if err != nil {
			t.Fatal(err)
		}
		rrs = append(rrs, rr)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		for _, rr := range rrs {
			if strings.EqualFold(rr.Header().Name, q.Question[0].Name) && rr.Header().Rrtype == q.Question[0].Qtype {
				m.Answer = append(m.Answer, rr)
			}
		}
		w.WriteMsg(m)
	})
	srv := &dns.Server{PacketConn: pc, Handler: h}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go srv.ActivateAndServe()
	<-started
	t.Cleanup(func() { srv.Shutdown() })
	return pc.LocalAddr().String()
}

// TestHostileDNSNamesSluice: DNS answers naming the node's own
// listeners. An SRV record carries its port, so a zone can name the
// admin listener: clients' requests would reach the control API from
// loopback (where it takes no token), with a Host header of their
// choosing. An address of the HTTP listener itself sends every request
// round through sluice until connections run out. Neither becomes a
// backend; the other addresses do.
func TestHostileDNSNamesSluice(t *testing.T) {
	port := loopBackends(t, 2)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	adminPort := l.Addr().(*net.TCPAddr).Port
	l.Close()
	server := zoneDNS(t,
		"self.test. 60 IN A 127.0.0.1", "self.test. 60 IN A 127.0.0.2",
		"admin.test. 60 IN A 127.0.0.1", "two.test. 60 IN A 127.0.0.2",
		fmt.Sprintf("_http._tcp.web.test. 60 IN SRV 1 1 %d admin.test.", adminPort),
		fmt.Sprintf("_http._tcp.web.test. 60 IN SRV 1 1 %d two.test.", port),
		"_http._tcp.any.test. 60 IN SRV 1 1 9 any.test.", "any.test. 60 IN A 127.0.0.3")
	cfg := testConfig(t)
	cfg.HTTP.Listen = fmt.Sprintf("127.0.0.1:%d", port)
	cfg.AdminListen = fmt.Sprintf("127.0.0.1:%d", adminPort)
	cfg.HTTPBackends = []string{fmt.Sprintf("dns:self.test:%d", port), "srv:web.test", "srv:any.test"}
	cfg.DNS = DNSConfig{Server: server, Timeout: time.Second}
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer n.Stop(time.Second)
	want := []string{"127.0.0.2:" + fmt.Sprint(port), "127.0.0.3:9"}
	if got := members(n.Generation("http")); !slices.Equal(got, want) {
		t.Errorf("members %v, want %v (none of the node's own listeners)", got, want)
	}
}

// TestHostileDNSFlappingMOPs: every address DNS ever gave kept a MOP
// limiter (so that an address that comes back keeps what it learned),
// and every one was exported at each save: a zone answering new
// addresses at every lookup grew them without bound. Past mopKeep
// limiters of a protocol, those least recently in a generation go.
func TestHostileDNSFlappingMOPs(t *testing.T) {
	defer func(k int) { mopKeep = k }(mopKeep)
	mopKeep = 50
	port := loopBackends(t, 1)
	cfg := testConfig(t)
	cfg.MOPProbe.Interval = time.Second
	plain := fmt.Sprintf("127.0.0.1:%d", port)
	cfg.HTTPBackends = []string{plain, "dns:flap.test:9,metrics=http://{host}:9/metrics"}
	cfg.DNS = DNSConfig{Server: flappingDNS(t, 20), MinTTL: time.Second, MaxTTL: time.Minute, KeepStale: time.Hour,
		Drain: time.Second, Timeout: time.Second}
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	clock := &fakeClock{t: time.Now()}
	n.dns.now = clock.Now
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer n.Stop(time.Second)
	for range 8 {
		clock.advance(t, n, time.Second)
	}
	states := n.mopStates()
	if len(states) > mopKeep {
		t.Fatalf("%d MOP limiters kept, want at most %d", len(states), mopKeep)
	}
	for _, b := range n.Generation("http").Pool("default").Backends() {
		if b.Addr() == plain {
			continue // no metrics=: no MOP
		}
		if _, ok := states["http/"+b.Addr()]; !ok {
			t.Errorf("backend %s in force lost its MOP state", b.Addr())
		}
	}
}
