package discovery

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicelb/sluice/discovery/dnsmasqtest"
)

func mustResolver(t *testing.T, server string) *Resolver {
	t.Helper()
	r, err := NewResolver(Config{Server: server, Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func addrs(ts []Target) string {
	var b []string
	for _, t := range ts {
		s := t.Addr.String()
		if t.Transport != "" || t.Priority != 0 || t.Weight != 0 {
			s += fmt.Sprintf("/p%d/w%d/%s/%s", t.Priority, t.Weight, t.Transport, t.Host)
		}
		b = append(b, s)
	}
	return strings.Join(b, " ")
}

// TestResolverDnsmasq asks a real dnsmasq for every kind of record and
// checks the targets against golden lists.
func TestResolverDnsmasq(t *testing.T) {
	var many strings.Builder
	for i := 1; i <= 120; i++ {
		fmt.Fprintf(&many, "10.9.%d.%d many.test\n", i/250, i%250+1)
	}
	hosts := "0.0.0.0 app.test\n224.0.0.1 app.test\n127.0.0.3 app.test\n127.0.0.2 app.test\n::1 app.test\n127.0.0.9 v4only.test\n" +
		"127.0.1.1 sip1.test\n127.0.1.2 sip2.test\n127.0.1.3 sip3.test\n127.0.1.4 tls1.test\n" + many.String()
	conf := []string{
		"srv-host=_sip._udp.carrier.test,sip1.test,5060,10,60",
		"srv-host=_sip._udp.carrier.test,sip2.test,5062,10,40",
		"srv-host=_sip._udp.carrier.test,sip3.test,5064,20,100",
		"srv-host=_sips._tcp.carrier.test,tls1.test,5061,5,1",
		"srv-host=_http._tcp.web.test,sip1.test,8080,1,7",
		"srv-host=_http._tcp.web.test,sip2.test,0,1,7",
		"srv-host=_sip._udp.off.test,.",
		"naptr-record=naptr.test,10,50,s,SIPS+D2T,,_sips._tcp.carrier.test",
		"naptr-record=naptr.test,20,50,s,SIP+D2U,,_sip._udp.carrier.test",
		"naptr-record=naptr.test,30,50,u,E2U+sip,!^.*$!sip:x@y!,",
	}
	for i := range MaxSRV {
		conf = append(conf, fmt.Sprintf("srv-host=_sip._udp.fan.test,none%d.test,5060,1,1", i))
	}
	srv := dnsmasqtest.Start(t, 1, conf, hosts)
	r := mustResolver(t, srv.Addr)
	ctx := context.Background()

	cases := []struct {
		name   string
		lookup func() (Answer, error)
		want   string
		notFnd bool
	}{
		{"A+AAAA sorted", func() (Answer, error) { return r.LookupHost(ctx, "app.test", 8080) },
			"127.0.0.2:8080 127.0.0.3:8080 [::1]:8080", false},
		{"A only", func() (Answer, error) { return r.LookupHost(ctx, "v4only.test.", 80) }, "127.0.0.9:80", false},
		{"NXDOMAIN", func() (Answer, error) { return r.LookupHost(ctx, "nope.test", 80) }, "", true},
		{"SRV full name", func() (Answer, error) { return r.LookupSRV(ctx, "_http._tcp.web.test", "") },
			"127.0.1.1:8080/p1/w7//sip1.test", false},
		{"SRV not offered", func() (Answer, error) { return r.LookupSRV(ctx, "_sip._udp.off.test", "udp") }, "", true},
		{"SIP SRV two priorities, TLS after UDP", func() (Answer, error) { return r.LookupSIPSRV(ctx, "carrier.test", nil) },
			"127.0.1.1:5060/p10/w60/udp/sip1.test 127.0.1.2:5062/p10/w40/udp/sip2.test 127.0.1.3:5064/p20/w100/udp/sip3.test 127.0.1.4:5061/p131077/w1/tls/tls1.test", false},
		{"SIP SRV tcp only: none", func() (Answer, error) {
			return r.LookupSIPSRV(ctx, "carrier.test", []Service{{"_sip._tcp.", "tcp"}})
		}, "", true},
		{"NAPTR order first", func() (Answer, error) { return r.LookupNAPTR(ctx, "naptr.test", nil) },
			"127.0.1.4:5061/p5/w1/tls/tls1.test 127.0.1.1:5060/p65546/w60/udp/sip1.test 127.0.1.2:5062/p65546/w40/udp/sip2.test 127.0.1.3:5064/p65556/w100/udp/sip3.test", false},
		{"NAPTR udp only", func() (Answer, error) { return r.LookupNAPTR(ctx, "naptr.test", []string{"udp"}) },
			"127.0.1.1:5060/p10/w60/udp/sip1.test 127.0.1.2:5062/p10/w40/udp/sip2.test 127.0.1.3:5064/p20/w100/udp/sip3.test", false},
		{"no NAPTR: SRV", func() (Answer, error) { return r.LookupNAPTR(ctx, "carrier.test", []string{"tls"}) },
			"127.0.1.4:5061/p5/w1/tls/tls1.test", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ans, err := c.lookup()
			if c.notFnd {
				if !errors.Is(err, ErrNotFound) {
					t.Fatalf("err %v, want ErrNotFound", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := addrs(ans.Targets); got != c.want {
				t.Errorf("targets\n got %s\nwant %s", got, c.want)
			}
			if ans.TTL != time.Second {
				t.Errorf("TTL %s, want 1s (local-ttl)", ans.TTL)
			}
		})
	}

	// 120 A records do not fit 1232 bytes: the UDP answer is truncated
	// and the lookup goes over TCP.
	t.Run("truncated over UDP, whole over TCP", func(t *testing.T) {
		ans, err := r.LookupHost(ctx, "many.test", 80)
		if err != nil {
			t.Fatal(err)
		}
		if len(ans.Targets) != 120 {
			t.Fatalf("%d targets, want 120", len(ans.Targets))
		}
		if ans.Targets[0].Addr != netip.MustParseAddrPort("10.9.0.2:80") {
			t.Errorf("first %s", ans.Targets[0].Addr)
		}
	})

	// 64 SRV targets without addresses cost two queries each: the
	// lookup stops at MaxQueries instead of fanning out.
	t.Run("query budget", func(t *testing.T) {
		_, err := r.LookupSRV(ctx, "_sip._udp.fan.test", "udp")
		if err == nil || errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "more than 128 queries") {
			t.Fatalf("err %v, want the query budget", err)
		}
	})

	// A resolver that does not answer is a failure, not "no such name".
	t.Run("server down", func(t *testing.T) {
		srv.Stop()
		defer srv.Restart()
		_, err := r.LookupHost(ctx, "app.test", 80)
		if err == nil || errors.Is(err, ErrNotFound) {
			t.Fatalf("err %v, want a failure that is not ErrNotFound", err)
		}
	})
}

// TestResolvConf reads the servers and search list of a resolv.conf.
func TestResolvConf(t *testing.T) {
	srv := dnsmasqtest.Start(t, 1, nil, "127.0.0.5 app.svc.test\n")
	host, port, _ := strings.Cut(srv.Addr, ":")
	path := filepath.Join(t.TempDir(), "resolv.conf")
	os.WriteFile(path, []byte("nameserver "+host+"\nsearch svc.test\noptions ndots:2 port:"+port+"\n"), 0o644)
	// miekg/dns reads no port option: name the port through the
	// server list instead.
	r, err := NewResolver(Config{ResolvConf: path, Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	r.servers = []string{srv.Addr}
	ans, err := r.LookupHost(context.Background(), "app", 80)
	if err != nil {
		t.Fatal(err)
	}
	if got := addrs(ans.Targets); got != "127.0.0.5:80" {
		t.Errorf("got %s", got)
	}
	if _, err := NewResolver(Config{ResolvConf: filepath.Join(t.TempDir(), "none")}); err == nil || !strings.Contains(err.Error(), "-dns-server") {
		t.Errorf("missing resolv.conf: %v", err)
	}
}

func TestServerAddr(t *testing.T) {
	for _, c := range []struct{ in, want, err string }{
		{"127.0.0.1", "127.0.0.1:53", ""},
		{"127.0.0.1:5353", "127.0.0.1:5353", ""},
		{"::1", "[::1]:53", ""},
		{"[::1]:5353", "[::1]:5353", ""},
		{"dns.example:53", "dns.example:53", ""},
		{"dns.example", "dns.example:53", ""},
		{"1.2.3.4:0", "", "bad port"},
		{"1.2.3.4:x", "", "bad port"},
		{"a b", "", "want an IP"},
	} {
		got, err := serverAddr(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: err %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q: %q %v, want %q", c.in, got, err, c.want)
		}
	}
	if _, err := NewResolver(Config{Server: "1.2.3.4:99999"}); err == nil || !strings.Contains(err.Error(), `-dns-server "1.2.3.4:99999"`) {
		t.Errorf("error does not name the flag: %v", err)
	}
}

func TestCheckName(t *testing.T) {
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"app.internal", true}, {"_sip._udp.example.com.", true}, {"a", true},
		{"", false}, {".", false}, {"a..b", false}, {"a b", false}, {"a/b", false},
		{strings.Repeat("a", 64) + ".b", false}, {strings.Repeat("a.", 127) + "aa", false},
	} {
		if err := CheckName(c.name); (err == nil) != c.ok {
			t.Errorf("%q: %v, want ok=%v", c.name, err, c.ok)
		}
	}
}
