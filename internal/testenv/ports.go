package testenv

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// Bound reports whether a socket of the kernel's table proto ("udp":
// bound; "tcp": listening) holds port on 127.0.0.1 or on every IPv4
// address, from /proc/net. A test that waits for a program it started to
// take a port asks this instead of trying to bind the port itself: a
// probe that holds the port for an instant can be what makes the
// program's own bind fail (EADDRINUSE).
func Bound(t testing.TB, proto string, port int) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/net/" + proto)
	if err != nil {
		t.Fatalf("reading the %s socket table: %v", proto, err)
	}
	return boundIn(string(b), proto, port)
}

// boundIn is Bound on the text of a /proc/net/udp or /proc/net/tcp table.
func boundIn(table, proto string, port int) bool {
	loopback, any := fmt.Sprintf("0100007F:%04X", port), fmt.Sprintf("00000000:%04X", port)
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || (f[1] != loopback && f[1] != any) {
			continue
		}
		if proto != "tcp" || f[3] == "0A" { // TCP_LISTEN
			return true
		}
	}
	return false
}

// FreePort returns 127.0.0.1:PORT with PORT free for both TCP and UDP
// and below the kernel's ephemeral range (ip_local_port_range), for a
// program the test starts, and starts again, on that address. A port
// taken with bind(":0") and closed would be the kernel's to hand out
// again: any test running beside this one that binds ":0" or connects
// may get it before the program binds it (EADDRINUSE at its start).
// Below the ephemeral range only an explicit bind takes it.
func FreePort(t testing.TB) string {
	t.Helper()
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	from := 10000
	if low-from < 1000 {
		from = 1024
	}
	for range 200 {
		port := 0 // no room below the range: the kernel's choice
		if low-from >= 100 {
			port = from + rand.IntN(low-from)
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		addr = ln.Addr().String()
		u, err := net.ListenPacket("udp", addr)
		ln.Close()
		if err != nil {
			continue
		}
		u.Close()
		return addr
	}
	t.Fatalf("no port free for both TCP and UDP between %d and %d", from, low)
	return ""
}

// FreePortNum is FreePort's port alone, for a program given a port
// number rather than an address.
func FreePortNum(t testing.TB) int {
	t.Helper()
	_, port, _ := net.SplitHostPort(FreePort(t))
	n, _ := strconv.Atoi(port)
	return n
}
