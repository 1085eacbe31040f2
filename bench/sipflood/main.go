// Command sipflood sends hostile SIP datagrams (random bytes, truncated and
// mangled messages, oversize datagrams, responses for nothing) to a
// loopback address at a fixed rate or as fast as one socket goes, for a
// bounded time, and prints what it sent. It refuses any address that is not
// loopback. bench/flood.sh runs it next to a SIPp call load.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:5060", "target UDP address (loopback only)")
	rate := flag.Int("rate", 20000, "datagrams per second; 0 sends as fast as the socket goes")
	dur := flag.Duration("duration", 30*time.Second, "how long to send (at most 10m)")
	flag.Parse()
	ap, err := netip.ParseAddrPort(*addr)
	if err != nil || !ap.Addr().IsLoopback() {
		fmt.Fprintf(os.Stderr, "sipflood: -addr %q: want a loopback ADDR:PORT\n", *addr)
		os.Exit(2)
	}
	if *dur <= 0 || *dur > 10*time.Minute || *rate < 0 {
		fmt.Fprintln(os.Stderr, "sipflood: -duration must be in (0, 10m] and -rate >= 0")
		os.Exit(2)
	}
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		fmt.Fprintln(os.Stderr, "sipflood:", err)
		os.Exit(1)
	}
	_ = c.SetReadBuffer(4 << 20)
	go func() { // read the 400s so they do not count as the target's drops
		buf := make([]byte, 65536)
		for {
			if _, _, err := c.ReadFromUDPAddrPort(buf); err != nil {
				return
			}
		}
	}()
	dgrams := datagrams(4096)
	start := time.Now()
	end := start.Add(*dur)
	i, errs := 0, 0
	send := func() {
		if _, err := c.WriteToUDPAddrPort(dgrams[i%len(dgrams)], ap); err != nil {
			errs++
		}
		i++
	}
	for now := time.Now(); now.Before(end); now = time.Now() {
		if *rate > 0 {
			due := int(now.Sub(start).Seconds() * float64(*rate))
			if i >= due {
				time.Sleep(2 * time.Millisecond)
				continue
			}
			for i < due {
				send()
			}
			continue
		}
		for range 256 {
			send()
		}
	}
	el := time.Since(start).Seconds()
	fmt.Printf("sent %d datagrams in %.1f s (%.0f/s), %d send errors\n", i, el, float64(i)/el, errs)
}

// datagrams returns n hostile datagrams, the same kinds as the sip
// package's flood test.
func datagrams(n int) [][]byte {
	rng := rand.New(rand.NewPCG(7, 1))
	tmpl := "INVITE sip:svc@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bK-fl%d\r\nMax-Forwards: 70\r\nFrom: <sip:a@x>;tag=f%d\r\nTo: <sip:svc@x>\r\nCall-ID: flood-%d@x\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n"
	out := make([][]byte, 0, n)
	for i := range n {
		valid := fmt.Sprintf(tmpl, i, i, i)
		var d []byte
		switch i % 8 {
		case 0:
			d = make([]byte, 1+rng.IntN(1400))
			for j := range d {
				d[j] = byte(rng.Uint32())
			}
		case 1, 2:
			d = []byte(valid[:1+rng.IntN(len(valid)-1)])
		case 3:
			d = []byte(strings.Replace(valid, "Call-ID:", "Call-ID", 1))
		case 4:
			d = []byte(strings.Replace(valid, "Via: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bK-fl"+strconv.Itoa(i)+"\r\n", "", 1))
		case 5:
			d = []byte(strings.Replace(valid, "Content-Length: 0", "Content-Length: 99999", 1))
		case 6:
			d = []byte(strings.Replace(strings.Replace(valid, "INVITE sip:svc@127.0.0.1 SIP/2.0", "SIP/2.0 200 OK", 1), "z9hG4bK-fl", "z9hG4bKslpnone", 1))
		case 7:
			if i%16 == 7 {
				d = bytes.Repeat([]byte("A"), 20000+rng.IntN(40000))
			} else {
				d = []byte("\r\n\r\n")
			}
		}
		out = append(out, d)
	}
	return out
}
