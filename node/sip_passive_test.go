package node

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// TestSIPSilentBackendEjected: a SIP backend that answers no INVITE (a
// black hole; its OPTIONS pings are off, so probes cannot say it) is
// ejected by its traffic after -health-max-fails unanswered INVITEs,
// and the calls after that go straight to the one that answers instead
// of each paying the failover timer there first. Every call completes.
func TestSIPSilentBackendEjected(t *testing.T) {
	dead, live := newSIPUAS(t, 0), newSIPUAS(t, 200)
	cfg := testConfig(t)
	cfg.SIPBackends = []string{fmt.Sprintf("127.0.0.1:%d", dead.port()), fmt.Sprintf("127.0.0.1:%d", live.port())}
	cfg.SIP.Policy = "round-robin"
	cfg.SIP.HealthInterval = 0
	cfg.SIP.FailoverTimeout = 200 * time.Millisecond
	cfg.Passive.MaxFails = 3
	cfg.Passive.Cooldown = time.Hour
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer n.Stop(time.Second)

	cl, err := net.DialUDP("udp", nil, n.Addrs().SIP.(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	lp := cl.LocalAddr().(*net.UDPAddr).Port
	const calls = 12
	buf := make([]byte, 65535)
	for i := range calls {
		invite := fmt.Sprintf("INVITE sip:bob@example.test SIP/2.0\r\n"+
			"Via: SIP/2.0/UDP 127.0.0.1:%d;branch=z9hG4bK-silent-%d;rport\r\n"+
			"Max-Forwards: 70\r\nFrom: <sip:alice@example.test>;tag=a%d\r\nTo: <sip:bob@example.test>\r\n"+
			"Call-ID: silent-%d\r\nCSeq: 1 INVITE\r\nContact: <sip:alice@127.0.0.1:%d>\r\nContent-Length: 0\r\n\r\n", lp, i, i, i, lp)
		if _, err := cl.Write([]byte(invite)); err != nil {
			t.Fatal(err)
		}
		cl.SetReadDeadline(time.Now().Add(10 * time.Second))
		final := ""
		for final == "" {
			k, err := cl.Read(buf)
			if err != nil {
				t.Fatalf("call %d: no final answer: %v", i, err)
			}
			status, _, _ := strings.Cut(string(buf[:k]), "\r\n")
			if !strings.HasPrefix(status, "SIP/2.0 1") {
				final = status
			}
		}
		if final != "SIP/2.0 200 OK" {
			t.Fatalf("call %d: final answer %q, want 200", i, final)
		}
	}
	if got := len(dead.invites()); got != cfg.Passive.MaxFails {
		t.Errorf("the silent backend got %d INVITEs of %d calls, want %d (-health-max-fails) and then none", got, calls, cfg.Passive.MaxFails)
	}
	if got := len(live.invites()); got != calls {
		t.Errorf("the live backend got %d INVITEs, want %d", got, calls)
	}
	for _, b := range n.Generation("sip").Pool("default").Backends() {
		if strings.HasSuffix(b.Addr(), fmt.Sprint(":", dead.port())) && !strings.Contains(b.Reason(n.clock.Now()), "ejected") {
			t.Errorf("silent backend's state: %q, want ejected by its traffic", b.Reason(n.clock.Now()))
		}
	}
}
