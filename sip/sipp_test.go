package sip

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicelb/sluice/internal/testenv"
)

// needSIPp returns the sipp binary, skipping the test when it is missing
// except in CI, where scripts/install-test-deps.sh installs it and a skip
// would hide a gap.
func needSIPp(t *testing.T) string {
	t.Helper()
	return testenv.Tool(t, "sipp", "sip-tester")
}

// freeUDPPort returns a loopback UDP port nobody listens on right now.
func freeUDPPort(t *testing.T) int {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// startSIPpUAS starts `sipp -sn uas` (or the scenario arguments given) on
// 127.0.0.1:port and waits until it listens. It is stopped (by its own PID)
// when the test ends.
func startSIPpUAS(t *testing.T, sipp, dir string, port int, scenario ...string) {
	t.Helper()
	if len(scenario) == 0 {
		scenario = []string{"-sn", "uas"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	cmd := exec.CommandContext(ctx, sipp, append(scenario, "-i", "127.0.0.1", "-p", strconv.Itoa(port), "-nostdin",
		"-trace_msg", "-message_file", filepath.Join(dir, fmt.Sprintf("uas%d.msg", port)))...)
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
		// The kernel's socket table, not a bind of our own, which
		// could make sipp's bind fail (EADDRINUSE, once in CI).
		if testenv.Bound(t, "udp", port) {
			return
		}
		select {
		case <-done:
			t.Fatalf("sipp uas on %d exited: %s", port, out.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("sipp uas on %d not listening after 5 s: %s", port, out.String())
}

// statColumn returns the value of column name in the last line of a SIPp
// -trace_stat CSV file (cumulative counts at the end of the run).
func statColumn(t *testing.T, csv []byte, name string) int {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(string(csv)), "\n")
	if len(lines) < 2 {
		t.Fatalf("stat file has %d lines", len(lines))
	}
	head, last := strings.Split(lines[0], ";"), strings.Split(lines[len(lines)-1], ";")
	for i, h := range head {
		if h == name && i < len(last) {
			n, err := strconv.Atoi(strings.TrimSpace(last[i]))
			if err != nil {
				t.Fatalf("stat %s: %q", name, last[i])
			}
			return n
		}
	}
	t.Fatalf("stat file has no column %s", name)
	return 0
}

// TestSIPpBuiltinUACEveryPolicy is the interop check of the dialog table
// with real SIPp: the built-in uac scenario (which ignores Record-Route,
// so its ACK and BYE carry no token) against two built-in uas answerers,
// under every -sip-lb-policy, with a MOP limiter on b1 so tiny that the
// policy's choice of b1 is refused and the INVITE moves to b2. Every call
// must succeed and no 481 may come back. Bounded: 200 calls at 50/s per
// policy, each sipp run under a 60 s timeout.
func TestSIPpBuiltinUACEveryPolicy(t *testing.T) {
	if testing.Short() {
		t.Skip("interop test with sipp")
	}
	sipp := needSIPp(t)
	const calls, rate = 200, 50
	for _, policy := range policies {
		t.Run(policy, func(t *testing.T) {
			dir := t.TempDir()
			p1, p2 := freeUDPPort(t), freeUDPPort(t)
			for p2 == p1 {
				p2 = freeUDPPort(t)
			}
			startSIPpUAS(t, sipp, dir, p1)
			startSIPpUAS(t, sipp, dir, p2)
			lo := netip.MustParseAddr("127.0.0.1")
			b1 := &uas{addr: netip.AddrPortFrom(lo, uint16(p1))}
			b2 := &uas{addr: netip.AddrPortFrom(lo, uint16(p2))}
			s := mopServer(t, []*uas{b1, b2}, func(c *Config) {
				c.Policy = policy
				// The default: sipp answerers on a busy machine can take
				// longer than the unit tests' 300 ms, and a silence
				// failover to b1 would meet its MOP and fail the call.
				c.FailoverTimeout = 2 * time.Second
			}, tinyMOP(t))

			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			stf, msgs := filepath.Join(dir, "uac.csv"), filepath.Join(dir, "uac.msg")
			cmd := exec.CommandContext(ctx, sipp, s.udpAddr().String(), "-sn", "uac", "-i", "127.0.0.1",
				"-p", strconv.Itoa(freeUDPPort(t)), "-r", strconv.Itoa(rate), "-m", strconv.Itoa(calls),
				"-nostdin", "-timeout", "40s", "-recv_timeout", "10000",
				"-trace_stat", "-stf", stf, "-fd", "1", "-trace_msg", "-message_file", msgs)
			cmd.Dir = dir
			out, err := cmd.CombinedOutput()
			csv, rerr := os.ReadFile(stf)
			if rerr != nil {
				t.Fatalf("sipp uac (%v) wrote no statistics: %v\n%s", err, rerr, out)
			}
			ok, failed := statColumn(t, csv, "SuccessfulCall(C)"), statColumn(t, csv, "FailedCall(C)")
			trace, _ := os.ReadFile(msgs)
			n481 := bytes.Count(trace, []byte("SIP/2.0 481"))
			invites := func(id string) uint64 { return s.pool.Load().byID[id].lb.Status(s.clock.Now()).Requests }
			t.Logf("%s: %d successful, %d failed, %d 481s; INVITEs at b1 %d, b2 %d; routed by the dialog table %d, by hash %d",
				policy, ok, failed, n481, invites("b1"), invites("b2"), s.metrics.DialogRouted.Load(), s.metrics.CallIDFallback.Load())
			if err != nil || ok != calls || failed != 0 || n481 != 0 {
				t.Errorf("sipp uac: exit %v, %d of %d calls successful, %d failed, %d 481s; want all, 0, 0\n%s",
					err, ok, calls, failed, n481, tail(out, 2000))
			}
			if r := s.metrics.DialogRouted.Load(); r < 2*calls {
				t.Errorf("%d requests routed by the dialog table, want at least %d (ACK and BYE of every call)", r, 2*calls)
			}
			if policy != "least-outstanding" && policy != "p2c" {
				// These policies would choose b1 for about half the calls;
				// its MOP lets one INVITE per 10 s through.
				if b1n := invites("b1"); b1n > 5 {
					t.Errorf("b1 took %d INVITEs: MOP moved too few to test anything", b1n)
				}
			}
		})
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
