package lb

import (
	"net/netip"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
)

// TestParseDNSSpec: template specs (dns:, srv:, naptr:) parse to their
// name and format back to the same text; bad ones are refused naming the
// part at fault.
func TestParseDNSSpec(t *testing.T) {
	for _, c := range []struct {
		proto, in string
		dns       DNSName
		canon     string
	}{
		{"http", "dns:App.Internal:8080", DNSName{Kind: "dns", Name: "app.internal", Port: 8080}, "dns:App.Internal:8080"},
		{"http", "dns:app:8080,weight=3,pool=api,health=/ok", DNSName{Kind: "dns", Name: "app", Port: 8080}, "dns:app:8080,weight=3,health=/ok,pool=api"},
		{"http", "srv:_http._tcp.web.example,tls=on", DNSName{Kind: "srv", Name: "_http._tcp.web.example"}, "srv:_http._tcp.web.example,tls=on"},
		{"http", "dns:app:80,metrics=http://{host}:9100/metrics", DNSName{Kind: "dns", Name: "app", Port: 80}, "dns:app:80,metrics=http://{host}:9100/metrics"},
		{"sip", "srv:example.com", DNSName{Kind: "srv", Name: "example.com"}, "srv:example.com"},
		{"sip", "srv:example.com,transport=udp", DNSName{Kind: "srv", Name: "example.com", Transport: "udp"}, "srv:example.com,transport=udp"},
		{"sip", "NAPTR:example.com,transport=tls", DNSName{Kind: "naptr", Name: "example.com", Transport: "tls"}, "NAPTR:example.com,transport=tls"},
		{"sip", "dns:sip.internal:5060,transport=tcp", DNSName{Kind: "dns", Name: "sip.internal", Port: 5060}, "dns:sip.internal:5060,transport=tcp"},
	} {
		b, err := ParseBackendSpec(c.proto, c.in)
		if err != nil {
			t.Errorf("%q: %v", c.in, err)
			continue
		}
		if b.DNS != c.dns {
			t.Errorf("%q: DNS %+v, want %+v", c.in, b.DNS, c.dns)
		}
		if b.ID != b.Addr {
			t.Errorf("%q: id %q, want the head %q", c.in, b.ID, b.Addr)
		}
		got := FormatBackendSpec(c.proto, b)
		if got != c.canon {
			t.Errorf("%q: formats as %q, want %q", c.in, got, c.canon)
		}
		back, err := ParseBackendSpec(c.proto, got)
		if err != nil || !reflect.DeepEqual(back, b) {
			t.Errorf("%q does not parse back: %+v %v", got, back, err)
		}
	}
	for _, c := range []struct{ proto, in, want string }{
		{"http", "dns:app", "want dns:HOST:PORT"},
		{"http", "dns:app:0", `bad port "0"`},
		{"http", "dns:10.0.0.1:80", "is an IP address: give it without dns:"},
		{"http", "dns:a b:80", "is not a DNS name"},
		{"http", "srv:", "is not a DNS name"},
		{"http", "naptr:example.com", "naptr: is for SIP backends"},
		{"http", "dns:app:80,id=x", "a DNS name gives several"},
		{"sip", "srv:example.com,weight=2", "comes from their SRV records"},
		{"http", "dns:app:80,metrics=http://10.0.0.1:9/m", "must name each by {host}"},
		{"http", "app:80:90", "want host:port, dns:HOST:PORT, srv:NAME"},
	} {
		_, err := ParseBackendSpec(c.proto, c.in)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.in) {
			t.Errorf("%s %q: %v, want an error quoting it with %q", c.proto, c.in, err, c.want)
		}
	}
}

// TestPlainHostNamedLikeAKind: a host called srv, dns or naptr with a
// port is a plain backend, as before names were understood.
func TestPlainHostNamedLikeAKind(t *testing.T) {
	for _, s := range []string{"srv:5060", "dns:53", "naptr:5060"} {
		b, err := ParseBackendSpec("sip", s)
		if err != nil || b.DNS.Kind != "" || b.Addr != s {
			t.Errorf("%q: %+v %v, want a plain backend", s, b, err)
		}
	}
}

// TestInstance: each address of a template becomes a plain spec.
func TestInstance(t *testing.T) {
	tpl, _ := ParseBackendSpec("http", "dns:app:8080,weight=3,pool=api,tls=on,metrics=http://{host}:9100/m")
	got := tpl.Instance(netip.MustParseAddrPort("[2001:db8::1]:8080"), "app", 0, 0, "")
	want := BackendSpec{Addr: "[2001:db8::1]:8080", ID: "[2001:db8::1]:8080", Weight: 3, MetricsURL: "http://[2001:db8::1]:9100/m",
		Pools: []string{"api"}, TLS: true, SNI: "app"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("dns instance\n got %+v\nwant %+v", got, want)
	}
	srv, _ := ParseBackendSpec("sip", "srv:example.com")
	for _, c := range []struct {
		weight, wantW int
		tr, wantTr    string
		wantSNI       string
	}{
		{0, 1, "udp", "udp", ""}, {60, 60, "tcp", "tcp", ""}, {65535, MaxWeight, "tls", "tls", "example.com"},
	} {
		in := srv.Instance(netip.MustParseAddrPort("10.0.0.1:5060"), "sip1.example.com", 10, c.weight, c.tr)
		if in.Weight != c.wantW || in.Transport != c.wantTr || in.SNI != c.wantSNI || in.Priority != 10 || in.DNS.Kind != "" {
			t.Errorf("srv weight %d %s: %+v", c.weight, c.tr, in)
		}
		if _, err := NewGeneration(GenConfig{Proto: "sip", Policy: "round-robin", Backends: []BackendSpec{in}}); err != nil {
			t.Errorf("instance does not build: %v", err)
		}
	}
	// The certificate checked is the domain's, never the SRV target's
	// (RFC 5922 §4): a zone without DNSSEC can name an attacker's host.
	for _, c := range []struct{ spec, want string }{
		{"srv:_sips._tcp.Example.com.", "example.com"},
		{"naptr:example.com", "example.com"},
		{"srv:example.com,transport=tls,sni=other.example", "other.example"},
	} {
		tpl, err := ParseBackendSpec("sip", c.spec)
		if err != nil {
			t.Fatalf("%s: %v", c.spec, err)
		}
		if in := tpl.Instance(netip.MustParseAddrPort("10.0.0.1:5061"), "evil.attacker.example", 0, 1, "tls"); in.SNI != c.want {
			t.Errorf("%s: instance at target evil.attacker.example verifies %q, want %q", c.spec, in.SNI, c.want)
		}
	}
	httpSRV, _ := ParseBackendSpec("http", "srv:_https._tcp.app.internal,tls=on")
	if in := httpSRV.Instance(netip.MustParseAddrPort("10.0.0.1:443"), "node7.app.internal", 0, 1, ""); in.SNI != "app.internal" {
		t.Errorf("http srv instance verifies %q, want app.internal", in.SNI)
	}
	if _, err := NewGeneration(GenConfig{Proto: "sip", Policy: "round-robin", Backends: []BackendSpec{srv}}); err == nil || !strings.Contains(err.Error(), "a DNS name, not an address") {
		t.Errorf("a template built a backend: %v", err)
	}
}

// dnsGen builds a generation of instances: addr/priority/gone.
func dnsGen(t testing.TB, policy string, specs ...BackendSpec) *Generation {
	t.Helper()
	g, err := NewGeneration(GenConfig{Proto: "sip", Policy: policy, Backends: specs})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func inst(addr string, prio, weight int, gone bool) BackendSpec {
	tpl := BackendSpec{DNS: DNSName{Kind: "srv", Name: "example.com"}, Transport: "udp"}
	s := tpl.Instance(netip.MustParseAddrPort(addr), "h", prio, weight, "udp")
	s.Gone = gone
	return s
}

// TestGoneDrains: a backend whose address left DNS takes no new work but
// keeps its affinity traffic, and says why.
func TestGoneDrains(t *testing.T) {
	g := dnsGen(t, "round-robin", inst("10.0.0.1:5060", 0, 1, false), inst("10.0.0.2:5060", 0, 1, true))
	p := g.Pool(DefaultPool)
	for i := range 10 {
		b, out, _ := p.Pick(int64(i), uint64(i), nil)
		if out != Picked || b.Addr() != "10.0.0.1:5060" {
			t.Fatalf("pick %d: %v %v", i, b, out)
		}
	}
	gone := p.Lookup("10.0.0.2:5060")
	if p.Pinned("10.0.0.2:5060", 0) != gone {
		t.Error("affinity to a gone backend refused")
	}
	if gone.State(0) != Draining || !strings.Contains(gone.Reason(0), "left DNS") || !gone.Gone() {
		t.Errorf("state %v reason %q", gone.State(0), gone.Reason(0))
	}
	if p.DrainedByOperator(0) {
		t.Error("a gone backend counted as an operator's drain")
	}
}

// TestPriorityFailover: new work goes to the lowest priority; a failover
// (PickTried with the tried set) takes every backend of it before the
// next priority, as RFC 3263 §4.3; a down backend is passed over.
func TestPriorityFailover(t *testing.T) {
	for _, policy := range PolicyNames {
		t.Run(policy, func(t *testing.T) {
			g := dnsGen(t, policy,
				inst("10.0.0.3:5060", 20, 1, false), inst("10.0.0.1:5060", 10, 60, false),
				inst("10.0.0.2:5060", 10, 40, false), inst("10.0.0.4:5060", 30, 1, false))
			p := g.Pool(DefaultPool)
			var tried Set
			var order []string
			for {
				b, out, _ := p.PickTried(0, 42, &tried)
				if out != Picked {
					break
				}
				order = append(order, b.Addr())
			}
			if len(order) != 4 || order[2] != "10.0.0.3:5060" || order[3] != "10.0.0.4:5060" ||
				!(order[0] == "10.0.0.1:5060" && order[1] == "10.0.0.2:5060" || order[0] == "10.0.0.2:5060" && order[1] == "10.0.0.1:5060") {
				t.Errorf("failover order %v", order)
			}
			p.Lookup("10.0.0.1:5060").Disable(true)
			p.Lookup("10.0.0.2:5060").Disable(true)
			if b, out, _ := p.Pick(0, 1, nil); out != Picked || b.Addr() != "10.0.0.3:5060" {
				t.Errorf("priority 10 down: picked %v %v, want the priority 20 backend", b, out)
			}
			if h := p.Home(0, 7); h == nil {
				t.Error("no home")
			}
		})
	}
}

// BenchmarkPickDNS: the request path of a pool built from DNS (SRV
// priorities, a gone member) takes no lock and allocates nothing:
// resolution happens elsewhere, and the pool is as fixed as any other.
func BenchmarkPickDNS(b *testing.B) {
	for _, pol := range []string{"round-robin", "weighted-round-robin", "p2c", "consistent-hash"} {
		b.Run(pol, func(b *testing.B) {
			g := dnsGen(b, pol, inst("10.0.0.1:5060", 10, 60, false), inst("10.0.0.2:5060", 10, 40, false),
				inst("10.0.0.3:5060", 10, 1, true), inst("10.0.0.4:5060", 20, 1, false))
			p := g.Pool(DefaultPool)
			var k atomic.Uint64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					key := k.Add(1)
					be, _, _ := p.Pick(int64(key), key, nil)
					be.Acquire()
					be.Release(int64(key), OK)
				}
			})
		})
	}
}

func TestPickDNSAllocates(t *testing.T) {
	g := dnsGen(t, "p2c", inst("10.0.0.1:5060", 10, 60, false), inst("10.0.0.3:5060", 10, 1, true), inst("10.0.0.4:5060", 20, 1, false))
	p := g.Pool(DefaultPool)
	if n := testing.AllocsPerRun(1000, func() {
		var tried Set
		p.PickTried(1, 2, &tried)
		p.PickTried(1, 2, &tried)
	}); n != 0 {
		t.Errorf("%v allocations per pick, want 0", n)
	}
}

// A gone backend that is also down by its health checks said only the
// health checks in /status: the operator could not tell it would go. Each
// reason that comes first now carries the gone mark after it, once.
func TestGoneReasonBesideAnother(t *testing.T) {
	tests := []struct {
		name string
		set  func(b *Backend)
		want string
	}{
		{"gone alone", func(*Backend) {}, reasonGone},
		{"probes down", func(b *Backend) { b.SetProbeDown(true) }, "down by its health checks, and no real answer since they failed; " + reasonGone},
		{"disabled", func(b *Backend) { b.Disable(true) }, "disabled by the operator; " + reasonGone},
		{"drained", func(b *Backend) { b.Drain(true) }, reasonGone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := dnsGen(t, "round-robin", inst("10.0.0.1:5060", 0, 1, false), inst("10.0.0.2:5060", 0, 1, true))
			b := g.Pool(DefaultPool).Lookup("10.0.0.2:5060")
			tt.set(b)
			if got := b.Reason(0); got != tt.want {
				t.Errorf("reason %q, want %q", got, tt.want)
			}
		})
	}
}
