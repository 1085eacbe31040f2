package sip

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// BenchmarkTCPKeepAliveFlood: a peer sends 16,384 keep-alives (64 KiB) in
// one go and reads the answers: what a flood of 4-byte pings costs the
// balancer per 64 KiB received.
func BenchmarkTCPKeepAliveFlood(b *testing.B) {
	b1 := newUAS(b, "b1")
	s := testServer(b, []*uas{b1}, nil, func(c *Config) { c.TCPFirstMessageTimeout = time.Hour })
	c, err := net.Dial("tcp", s.udpAddr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	const n = 16384
	pings := []byte(strings.Repeat("\r\n\r\n", n))
	pongs := make([]byte, 2*n)
	b.SetBytes(int64(len(pings)))
	b.ResetTimer()
	for range b.N {
		_ = c.SetDeadline(time.Now().Add(wait))
		go func() { _, _ = c.Write(pings) }()
		if _, err := io.ReadFull(c, pongs); err != nil {
			b.Fatal(err)
		}
	}
}
