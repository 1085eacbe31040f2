package testenv

import (
	"fmt"
	"os"
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
