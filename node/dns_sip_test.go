package node

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicelb/sluice/discovery/dnsmasqtest"
)

// sipUAS answers every INVITE it gets with code (and a Contact for 2xx;
// 0: never),
// recording each INVITE's arrival; other requests (ACK) are read and
// left unanswered.
type sipUAS struct {
	conn     *net.UDPConn
	code     int
	mu       sync.Mutex
	got      []time.Time
	branches []string
}

func newSIPUAS(t *testing.T, code int) *sipUAS {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	u := &sipUAS{conn: c, code: code}
	t.Cleanup(func() { c.Close() })
	go u.serve()
	return u
}

func (u *sipUAS) port() int { return u.conn.LocalAddr().(*net.UDPAddr).Port }

func (u *sipUAS) invites() []time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]time.Time(nil), u.got...)
}

func (u *sipUAS) serve() {
	buf := make([]byte, 65535)
	for {
		n, from, err := u.conn.ReadFromUDP(buf)
		if err != nil {
			return
		}
		msg := string(buf[:n])
		if !strings.HasPrefix(msg, "INVITE ") {
			continue
		}
		// One INVITE per branch: a retransmission (Timer A) is not
		// another attempt.
		branch := ""
		if _, after, ok := strings.Cut(msg, ";branch="); ok {
			branch, _, _ = strings.Cut(after, "\r\n")
			branch, _, _ = strings.Cut(branch, ";")
		}
		u.mu.Lock()
		if !slices.Contains(u.branches, branch) {
			u.branches = append(u.branches, branch)
			u.got = append(u.got, time.Now())
		}
		u.mu.Unlock()
		if u.code == 0 {
			continue // a black hole: the INVITE times out
		}
		reason := map[int]string{200: "OK", 503: "Service Unavailable"}[u.code]
		var b strings.Builder
		fmt.Fprintf(&b, "SIP/2.0 %d %s\r\n", u.code, reason)
		head, _, _ := strings.Cut(msg, "\r\n\r\n")
		for _, line := range strings.Split(head, "\r\n")[1:] {
			name, _, _ := strings.Cut(line, ":")
			switch strings.ToLower(strings.TrimSpace(name)) {
			case "via", "v", "from", "f", "call-id", "i", "cseq":
				b.WriteString(line + "\r\n")
			case "to", "t":
				b.WriteString(line + ";tag=uas1\r\n")
			}
		}
		if u.code == 200 {
			fmt.Fprintf(&b, "Contact: <sip:uas@127.0.0.1:%d>\r\n", u.port())
		}
		b.WriteString("Content-Length: 0\r\n\r\n")
		u.conn.WriteToUDP([]byte(b.String()), from)
	}
}

// TestSIPSRVFailover: -sip-backend srv:carrier.test on a real dnsmasq
// with two SRV priorities. Both backends of priority 10 fail (503, or
// one answers nothing and times out): the INVITE goes to each of them,
// then to the priority 20 backend, whose 200 reaches the caller (RFC 3263
// §4.3). SRV weights are the backends' weights and the transport is the
// service's.
func TestSIPSRVFailover(t *testing.T) {
	for _, c := range []struct {
		name string
		a, b int
	}{{"503", 503, 503}, {"timeout", 0, 503}} {
		t.Run(c.name, func(t *testing.T) { sipSRVFailover(t, c.a, c.b) })
	}
}

func sipSRVFailover(t *testing.T, codeA, codeB int) {
	a, b, c := newSIPUAS(t, codeA), newSIPUAS(t, codeB), newSIPUAS(t, 200)
	conf := []string{
		fmt.Sprintf("srv-host=_sip._udp.carrier.test,a.carrier.test,%d,10,60", a.port()),
		fmt.Sprintf("srv-host=_sip._udp.carrier.test,b.carrier.test,%d,10,40", b.port()),
		fmt.Sprintf("srv-host=_sip._udp.carrier.test,c.carrier.test,%d,20,5", c.port()),
	}
	dnsd := dnsmasqtest.Start(t, 60, conf, "127.0.0.1 a.carrier.test\n127.0.0.1 b.carrier.test\n127.0.0.1 c.carrier.test\n")
	cfg := testConfig(t)
	cfg.SIPBackends = []string{"srv:carrier.test,pool=carrier"}
	cfg.SIPRoutes = []string{"pool=carrier"}
	cfg.DNS = DNSConfig{Server: dnsd.Addr}
	cfg.SIP.FailoverTimeout = 300 * time.Millisecond
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer n.Stop(time.Second)

	want := map[int][2]int{a.port(): {10, 60}, b.port(): {10, 40}, c.port(): {20, 5}}
	for _, be := range n.Generation("sip").Pool("carrier").Backends() {
		_, p, _ := net.SplitHostPort(be.Addr())
		var port int
		fmt.Sscan(p, &port)
		w, ok := want[port]
		spec := n.Generation("sip").Spec(be)
		if !ok || be.Priority() != w[0] || be.Weight() != w[1] || spec.Transport != "udp" {
			t.Errorf("backend %s: priority %d weight %d transport %s", be.Addr(), be.Priority(), be.Weight(), spec.Transport)
		}
	}

	cl, err := net.DialUDP("udp", nil, n.Addrs().SIP.(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	lp := cl.LocalAddr().(*net.UDPAddr).Port
	invite := fmt.Sprintf("INVITE sip:bob@carrier.test SIP/2.0\r\n"+
		"Via: SIP/2.0/UDP 127.0.0.1:%d;branch=z9hG4bK-srv-1;rport\r\n"+
		"Max-Forwards: 70\r\nFrom: <sip:alice@example.test>;tag=a1\r\nTo: <sip:bob@carrier.test>\r\n"+
		"Call-ID: srv-failover-1\r\nCSeq: 1 INVITE\r\nContact: <sip:alice@127.0.0.1:%d>\r\nContent-Length: 0\r\n\r\n", lp, lp)
	if _, err := cl.Write([]byte(invite)); err != nil {
		t.Fatal(err)
	}
	cl.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 65535)
	final := ""
	for final == "" {
		k, err := cl.Read(buf)
		if err != nil {
			t.Fatalf("no final answer: %v", err)
		}
		status, _, _ := strings.Cut(string(buf[:k]), "\r\n")
		if !strings.HasPrefix(status, "SIP/2.0 1") {
			final = status
		}
	}
	if final != "SIP/2.0 200 OK" {
		t.Fatalf("final answer %q, want 200 from the priority 20 backend", final)
	}
	ia, ib, ic := a.invites(), b.invites(), c.invites()
	if len(ia) != 1 || len(ib) != 1 || len(ic) != 1 {
		t.Fatalf("INVITEs at priority 10: %d and %d, priority 20: %d; want one each", len(ia), len(ib), len(ic))
	}
	if !ic[0].After(ia[0]) || !ic[0].After(ib[0]) {
		t.Error("the priority 20 backend got the INVITE before a priority 10 one")
	}
}
