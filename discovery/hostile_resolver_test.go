package discovery

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// hostileServer answers every A and AAAA query with rrs (their owner
// name set to the question's), on a UDP port of loopback.
func hostileServer(t *testing.T, rrs []string) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		for _, s := range rrs {
			rr, err := dns.NewRR(q.Question[0].Name + " " + s)
			if err != nil {
				t.Error(err)
				continue
			}
			if rr.Header().Rrtype == q.Question[0].Qtype {
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

// TestHostileAddresses: a zone (or a hostile resolver) that names
// addresses nothing may be sent to, or mixes a TTL of 0 with long ones.
// The limited broadcast address and 0.0.0.0/8 ("this network": on Linux
// a connection to 0.0.0.0 reaches the host itself) are no backends, like
// the unspecified address and multicast groups; a TTL of 0 is the
// answer's TTL (the tracker then asks again at -dns-min-ttl), not a
// missing one.
func TestHostileAddresses(t *testing.T) {
	cases := []struct {
		name    string
		records []string
		want    string
		ttl     time.Duration
	}{
		{"broadcast, this network, multicast, unspecified",
			[]string{"60 IN A 255.255.255.255", "60 IN A 0.0.0.0", "60 IN A 0.1.2.3", "60 IN A 224.0.0.1",
				"60 IN AAAA ff02::1", "60 IN AAAA ::", "60 IN A 127.0.0.5", "60 IN AAAA ::ffff:0.0.0.0"},
			"127.0.0.5:5060", 60 * time.Second},
		{"TTL 0 beside TTL 300", []string{"0 IN A 127.0.0.6", "300 IN A 127.0.0.7"},
			"127.0.0.6:5060 127.0.0.7:5060", 0},
		{"TTL 300 beside TTL 0", []string{"300 IN A 127.0.0.7", "0 IN AAAA ::1"},
			"127.0.0.7:5060 [::1]:5060", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := mustResolver(t, hostileServer(t, c.records))
			ans, err := r.LookupHost(context.Background(), "evil.test", 5060)
			if err != nil {
				t.Fatal(err)
			}
			if got := addrs(ans.Targets); got != c.want {
				t.Errorf("targets\n got %s\nwant %s", got, c.want)
			}
			if ans.TTL != c.ttl {
				t.Errorf("TTL %s, want %s", ans.TTL, c.ttl)
			}
		})
	}
}

// TestRefusedAAAANamesTheUnusedA: a resolver that answers A but refuses
// AAAA (dnsmasq without upstream servers does) fails the lookup, and the
// error says the A answer was there and why it is not used, so that an
// operator whose `dig A` works can tell what is wrong.
func TestRefusedAAAANamesTheUnusedA(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		switch q.Question[0].Qtype {
		case dns.TypeA:
			for _, a := range []string{"127.0.0.2", "127.0.0.3"} {
				rr, _ := dns.NewRR(q.Question[0].Name + " 60 IN A " + a)
				m.Answer = append(m.Answer, rr)
			}
		default:
			m.Rcode = dns.RcodeRefused
		}
		w.WriteMsg(m)
	})
	srv := &dns.Server{PacketConn: pc, Handler: h}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go srv.ActivateAndServe()
	<-started
	t.Cleanup(func() { srv.Shutdown() })

	r := mustResolver(t, pc.LocalAddr().String())
	_, err = r.LookupHost(context.Background(), "app.test", 8080)
	if err == nil {
		t.Fatal("lookup with AAAA refused: no error")
	}
	for _, want := range []string{"AAAA app.test.", "REFUSED", "its A query gave 2 addresses, not used", "-dns-family ipv4"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}

	// -dns-family: ipv4 asks A only and takes its answer; ipv6 asks AAAA
	// only and fails on its refusal; a value not known is refused.
	for _, tc := range []struct {
		family, addrs, err string
	}{
		{"ipv4", "127.0.0.2:8080 127.0.0.3:8080", ""},
		{"ipv6", "", "REFUSED"},
		{"any", "", "its A query gave 2 addresses"},
	} {
		r, err := NewResolver(Config{Server: pc.LocalAddr().String(), Timeout: 500 * time.Millisecond, Family: tc.family})
		if err != nil {
			t.Fatal(err)
		}
		ans, err := r.LookupHost(context.Background(), "app.test", 8080)
		if got := addrs(ans.Targets); got != tc.addrs || (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("family %s: %q, %v; want %q, an error with %q", tc.family, got, err, tc.addrs, tc.err)
		}
	}
	if _, err := NewResolver(Config{Server: pc.LocalAddr().String(), Family: "inet4"}); err == nil || !strings.Contains(err.Error(), "-dns-family") {
		t.Errorf("family inet4: %v, want an error naming -dns-family", err)
	}
}
