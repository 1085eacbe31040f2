package testenv

import (
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// fakeT records how a test ended without ending the real one.
type fakeT struct {
	testing.TB
	failed, skipped bool
}

func (f *fakeT) Helper()                           {}
func (f *fakeT) Fatalf(format string, args ...any) { f.failed = true }
func (f *fakeT) Skip(args ...any)                  { f.skipped = true }

func TestMissingFailsInCIAndSkipsElsewhere(t *testing.T) {
	for _, tc := range []struct {
		ci               string
		wantFail, wantSk bool
	}{
		{ci: "", wantSk: true},
		{ci: "1", wantFail: true},
		{ci: "true", wantFail: true},
	} {
		t.Setenv("CI", tc.ci)
		f := &fakeT{}
		Tool(f, "no-such-program-sluice-test", "none")
		if f.failed != tc.wantFail || f.skipped != tc.wantSk {
			t.Errorf("CI=%q: failed=%v skipped=%v, want failed=%v skipped=%v", tc.ci, f.failed, f.skipped, tc.wantFail, tc.wantSk)
		}
	}
}

func TestToolFindsAProgram(t *testing.T) {
	t.Setenv("CI", "1")
	f := &fakeT{}
	if p := Tool(f, "go", "golang"); p == "" || f.failed || f.skipped {
		t.Fatalf("go not found: %q failed=%v skipped=%v", p, f.failed, f.skipped)
	}
}

// TestBoundIn: golden lines of /proc/net/udp and /proc/net/tcp (kernel
// 6.18) for port 15060 (0x3AD4).
func TestBoundIn(t *testing.T) {
	const head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
	udpLo := head + "  12: 0100007F:3AD4 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4242 2 0000000000000000 0\n"
	udpAny := head + "  12: 00000000:3AD4 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4242 2 0000000000000000 0\n"
	udpOther := head + "  12: 0200007F:3AD4 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4242 2 0000000000000000 0\n"
	tcpListen := head + "   3: 0100007F:3AD4 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4243 1 0000000000000000 100 0 0 10 0\n"
	tcpEstab := head + "   3: 0100007F:3AD4 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 4243 1 0000000000000000 100 0 0 10 0\n"
	for _, c := range []struct {
		name, table, proto string
		port               int
		want               bool
	}{
		{"udp loopback", udpLo, "udp", 15060, true},
		{"udp any address", udpAny, "udp", 15060, true},
		{"udp other address", udpOther, "udp", 15060, false},
		{"udp other port", udpLo, "udp", 15061, false},
		{"tcp listening", tcpListen, "tcp", 15060, true},
		{"tcp connection, not listening", tcpEstab, "tcp", 15060, false},
		{"header only", head, "udp", 15060, false},
	} {
		if got := boundIn(c.table, c.proto, c.port); got != c.want {
			t.Errorf("%s: boundIn = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestFreePortBelowEphemeral: the address FreePort gives is free for TCP
// and UDP and below the kernel's ephemeral range, so no socket bound to
// ":0" beside the test can take it.
func TestFreePortBelowEphemeral(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Skip("no /proc/sys/net/ipv4/ip_local_port_range here")
	}
	low, _ := strconv.Atoi(strings.Fields(string(b))[0])
	for range 20 {
		addr := FreePort(t)
		_, p, _ := net.SplitHostPort(addr)
		port, _ := strconv.Atoi(p)
		if low > 1124 && port >= low {
			t.Fatalf("FreePort gave %s, inside the ephemeral range from %d", addr, low)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("TCP on %s: %v", addr, err)
		}
		u, err := net.ListenPacket("udp", addr)
		ln.Close()
		if err != nil {
			t.Fatalf("UDP on %s: %v", addr, err)
		}
		u.Close()
	}
}
