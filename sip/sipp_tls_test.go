package sip

import (
	"bytes"
	"context"
	"encoding/pem"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/sluicelb/sluice/internal/testenv"
)

// freeTCPPort returns a loopback TCP port nobody listens on right now.
func freeTCPPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startStunnel runs stunnel in client mode: plain TCP accepted on
// 127.0.0.1:accept is carried over TLS to connect, whose certificate must
// chain to caFile and name sip.test. It waits until stunnel listens and
// stops it (by its own PID) when the test ends. Debian's SIPp has no TLS;
// this is how its TCP transport reaches a SIP over TLS listener.
func startStunnel(t *testing.T, dir string, accept int, connect, caFile string) {
	t.Helper()
	bin := testenv.Tool(t, "stunnel4", "stunnel4")
	conf := filepath.Join(dir, "stunnel.conf")
	cfg := fmt.Sprintf("foreground = yes\npid =\ndebug = 4\n[sip]\nclient = yes\naccept = 127.0.0.1:%d\nconnect = %s\nverifyChain = yes\nCAfile = %s\ncheckHost = sip.test\n",
		accept, connect, caFile)
	if err := os.WriteFile(conf, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	cmd := exec.CommandContext(ctx, bin, conf)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		cancel()
	})
	for range 100 {
		if testenv.Bound(t, "tcp", accept) {
			return // stunnel listens (a listener of our own could fail its bind)
		}
		select {
		case <-done:
			t.Fatalf("stunnel exited: %s", out.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("stunnel not listening on %d after 5 s: %s", accept, out.String())
}

// TestSIPpOverTLSViaStunnel is the load part of SIP over TLS with a real
// client: SIPp's record-route aware UAC over one TCP connection (-t t1)
// into stunnel, which carries it over TLS to sluice's TLS listener;
// sluice sends the calls to two SIPp answerers over UDP (double
// Record-Route: the client-facing entry names the TLS listener with the
// flow token, so ACK and BYE come back over the same TLS connection and
// reach the INVITE's backend). Every call must succeed. Bounded: 200
// calls at 50/s under a 60 s timeout.
func TestSIPpOverTLSViaStunnel(t *testing.T) {
	if testing.Short() {
		t.Skip("interop test with sipp and stunnel")
	}
	sipp := needSIPp(t)
	const calls, rate = 200, 50
	dir := t.TempDir()
	scen, err := filepath.Abs("testdata/sipp")
	if err != nil {
		t.Fatal(err)
	}
	p1, p2 := freeUDPPort(t), freeUDPPort(t)
	for p2 == p1 {
		p2 = freeUDPPort(t)
	}
	startSIPpUAS(t, sipp, dir, p1, "-sf", filepath.Join(scen, "uas_rr.xml"))
	startSIPpUAS(t, sipp, dir, p2, "-sf", filepath.Join(scen, "uas_rr.xml"))
	lo := netip.MustParseAddr("127.0.0.1")
	b1 := &uas{addr: netip.AddrPortFrom(lo, uint16(p1))}
	b2 := &uas{addr: netip.AddrPortFrom(lo, uint16(p2))}
	srv, _ := testTLS(t)
	s := testServer(t, []*uas{b1, b2}, nil, func(c *Config) {
		c.TLSListen, c.TLSConfig = "127.0.0.1:0", srv
		c.FailoverTimeout = 2 * time.Second // sipp answerers on a busy machine
	})
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificates[0].Certificate[0]}), 0o600); err != nil {
		t.Fatal(err)
	}
	tunnel := freeTCPPort(t)
	startStunnel(t, dir, tunnel, s.TLSAddr().String(), ca)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stf, msgs := filepath.Join(dir, "uac.csv"), filepath.Join(dir, "uac.msg")
	cmd := exec.CommandContext(ctx, sipp, fmt.Sprintf("127.0.0.1:%d", tunnel), "-sf", filepath.Join(scen, "uac_rr.xml"),
		"-t", "t1", "-i", "127.0.0.1", "-p", strconv.Itoa(freeTCPPort(t)), "-r", strconv.Itoa(rate), "-m", strconv.Itoa(calls),
		"-nostdin", "-timeout", "40s", "-recv_timeout", "10000",
		"-trace_stat", "-stf", stf, "-fd", "1", "-trace_err", "-error_file", msgs)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	csv, rerr := os.ReadFile(stf)
	if rerr != nil {
		t.Fatalf("sipp uac (%v) wrote no statistics: %v\n%s", err, rerr, out)
	}
	ok, failed := statColumn(t, csv, "SuccessfulCall(C)"), statColumn(t, csv, "FailedCall(C)")
	m := s.Metrics()
	t.Logf("%d successful, %d failed; forwarded %d, forged tokens %d, handshake failures %d, in-dialog unanswered (408) %d, forged responses %d",
		ok, failed, m.Forwarded.Load(), m.ForgedTokens.Load(), m.HandshakeFailures.Load(), m.InDialogUnanswered.Load(), m.ForgedResponses.Load())
	if err != nil || ok != calls || failed != 0 {
		errs, _ := os.ReadFile(msgs)
		t.Errorf("sipp uac over stunnel: exit %v, %d of %d calls successful, %d failed; want all and 0\n%s\n%s",
			err, ok, calls, failed, tail(out, 2000), tail(errs, 2000))
	}
	if n := m.ForgedTokens.Load(); n != 0 {
		t.Errorf("forged_tokens %d: our client-facing routes came back unrecognised", n)
	}
}
