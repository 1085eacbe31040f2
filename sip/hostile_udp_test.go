package sip

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"
)

// hostileDatagrams returns n datagrams of the kinds a flood is made of:
// random bytes, valid messages cut at a random point, messages with a
// header mangled or missing, oversize datagrams, bare CRLFs and responses
// for transactions that never existed.
func hostileDatagrams(n int, seed uint64) [][]byte {
	rng := rand.New(rand.NewPCG(seed, 1))
	tmpl := "INVITE sip:svc@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bK-fl%d\r\nMax-Forwards: 70\r\nFrom: <sip:a@x>;tag=f%d\r\nTo: <sip:svc@x>\r\nCall-ID: flood-%d@x\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n"
	out := make([][]byte, 0, n)
	for i := range n {
		valid := fmt.Sprintf(tmpl, i, i, i)
		var d []byte
		switch i % 8 {
		case 0: // random bytes
			d = make([]byte, 1+rng.IntN(1400))
			for j := range d {
				d[j] = byte(rng.Uint32())
			}
		case 1, 2: // truncated
			d = []byte(valid[:1+rng.IntN(len(valid)-1)])
		case 3: // a header without its colon
			d = []byte(strings.Replace(valid, "Call-ID:", "Call-ID", 1))
		case 4: // no Via
			d = []byte(strings.Replace(valid, "Via: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bK-fl"+strconv.Itoa(i)+"\r\n", "", 1))
		case 5: // Content-Length larger than the datagram
			d = []byte(strings.Replace(valid, "Content-Length: 0", "Content-Length: 99999", 1))
		case 6: // a response for nothing
			d = []byte(strings.Replace(strings.Replace(valid, "INVITE sip:svc@127.0.0.1 SIP/2.0", "SIP/2.0 200 OK", 1), "z9hG4bK-fl", "z9hG4bKslpnone", 1))
		case 7:
			if i%16 == 7 {
				d = bytes.Repeat([]byte("A"), 20000+rng.IntN(40000)) // over the flood server's -sip-max-message
			} else {
				d = []byte("\r\n\r\n")
			}
		}
		out = append(out, d)
	}
	return out
}

// udpSocketDrops sums the kernel's drop counters (the last column of
// /proc/net/udp) of the loopback UDP sockets bound to ports: the datagrams
// the kernel discarded for those sockets alone, not the host's (which other
// tests running beside this one move too). It fails the test when the table
// cannot be read: a missing count must not excuse a failed call.
func udpSocketDrops(t testing.TB, ports map[uint16]bool) int64 {
	t.Helper()
	f, err := os.Open("/proc/net/udp")
	if err != nil {
		t.Fatalf("per-socket drop counts: %v", err)
	}
	defer f.Close()
	var sum int64
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 13 {
			continue
		}
		_, portHex, ok := strings.Cut(fields[1], ":")
		if !ok {
			continue
		}
		port, err := strconv.ParseUint(portHex, 16, 16)
		if err != nil || !ports[uint16(port)] {
			continue
		}
		d, err := strconv.ParseInt(fields[len(fields)-1], 10, 64)
		if err != nil {
			t.Fatalf("/proc/net/udp drops %q: %v", fields[len(fields)-1], err)
		}
		sum += d
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("/proc/net/udp: %v", err)
	}
	return sum
}

// tryCall runs INVITE/180/200/ACK/BYE/200 without retransmitting and
// reports the first thing that went wrong.
func tryCall(conn *net.UDPConn, lbAddr netip.AddrPort, id string) error {
	self := conn.LocalAddr().String()
	send := func(s string) error {
		_, err := conn.WriteToUDPAddrPort([]byte(s), lbAddr)
		return err
	}
	buf := make([]byte, 65536)
	await := func(method string, code int) (*gosip.Response, error) {
		_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		for {
			n, _, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return nil, fmt.Errorf("waiting for %d to %s: %w", code, method, err)
			}
			m, err := gosip.ParseMessage(append([]byte(nil), buf[:n]...))
			if err != nil {
				continue
			}
			res, ok := m.(*gosip.Response)
			if !ok || res.CSeq() == nil || string(res.CSeq().MethodName) != method || res.StatusCode < 200 {
				continue
			}
			if res.StatusCode != code {
				return nil, fmt.Errorf("%s answered %d", method, res.StatusCode)
			}
			return res, nil
		}
	}
	inv := fmt.Sprintf("INVITE sip:service@%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-%s;rport\r\nMax-Forwards: 70\r\nFrom: <sip:alice@test>;tag=a%s\r\nTo: <sip:service@test>\r\nCall-ID: %s\r\nCSeq: 1 INVITE\r\nContact: <sip:alice@%s>\r\nContent-Length: 0\r\n\r\n",
		lbAddr, self, id, id, id, self)
	if err := send(inv); err != nil {
		return err
	}
	ok, err := await("INVITE", 200)
	if err != nil {
		return err
	}
	tag, _ := ok.To().Params.Get("tag")
	routes := ""
	rrs := ok.GetHeaders("Record-Route")
	for i := len(rrs) - 1; i >= 0; i-- {
		routes += "Route: " + rrs[i].Value() + "\r\n"
	}
	target := "sip:service@" + lbAddr.String()
	if h := ok.GetHeader("contact"); h != nil {
		target = strings.Trim(h.Value(), "<>")
	}
	in := func(m string, cseq int) string {
		return fmt.Sprintf("%s %s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-%s-%d;rport\r\nMax-Forwards: 70\r\n%sFrom: <sip:alice@test>;tag=a%s\r\nTo: <sip:service@test>;tag=%s\r\nCall-ID: %s\r\nCSeq: %d %s\r\nContent-Length: 0\r\n\r\n",
			m, target, self, id, cseq, routes, id, tag, id, cseq, m)
	}
	if err := send(in("ACK", 1)); err != nil {
		return err
	}
	if err := send(in("BYE", 2)); err != nil {
		return err
	}
	_, err = await("BYE", 200)
	return err
}

// floodResult is what one flood run measured.
type floodResult struct {
	sent, callsOK, callsFailed, kernelDrops int64
	peakHeap, baseHeap                      uint64
	firstErr                                error
}

// runFlood sends hostile datagrams at rate per second (0: as fast as one
// socket goes) for d, while workers place calls back to back; then one more
// call must complete at once.
func runFlood(t *testing.T, rate int, d time.Duration, workers int) floodResult {
	b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
	b1.drop.Store(true)
	b2.drop.Store(true)
	s := testServer(t, []*uas{b1, b2}, nil, func(c *Config) { c.MaxMessage = 16 << 10 })
	lbAddr := s.udpAddr()
	dgrams := hostileDatagrams(4096, 7)
	fl, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	_ = fl.SetReadBuffer(4 << 20)
	drained := make(chan struct{})
	go func() { // read the 400s, so that the kernel drops counted are the balancer's
		defer close(drained)
		buf := make([]byte, 65536)
		for {
			if _, _, err := fl.ReadFromUDPAddrPort(buf); err != nil {
				return
			}
		}
	}()
	defer func() { fl.Close(); <-drained }()
	heapSample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(heapSample)
	res := floodResult{baseHeap: heapSample[0].Value.Uint64()}
	// The sockets a call crosses: the balancer's, the backends', the
	// callers'. Their drops, and no others, may excuse a failed call.
	ports := map[uint16]bool{lbAddr.Port(): true, b1.addr.Port(): true, b2.addr.Port(): true}
	callers := make([]*net.UDPConn, workers)
	for w := range callers {
		c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		callers[w] = c
		ports[uint16(c.LocalAddr().(*net.UDPAddr).Port)] = true
	}
	drops0 := udpSocketDrops(t, ports)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var ok, failed atomic.Int64
	var errMu sync.Mutex
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := callers[w]
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if err := tryCall(c, lbAddr, fmt.Sprintf("fl-%d-%d", w, i)); err != nil {
					failed.Add(1)
					errMu.Lock()
					if res.firstErr == nil {
						res.firstErr = err
					}
					errMu.Unlock()
					continue
				}
				ok.Add(1)
			}
		}()
	}
	var peak atomic.Uint64
	wg.Add(1)
	go func() { // heap sampler
		defer wg.Done()
		ss := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		tk := time.NewTicker(50 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				metrics.Read(ss)
				if v := ss[0].Value.Uint64(); v > peak.Load() {
					peak.Store(v)
				}
			}
		}
	}()
	start := time.Now()
	end := start.Add(d)
	i := 0
	for now := time.Now(); now.Before(end); now = time.Now() {
		if rate > 0 { // pace in 5 ms steps
			due := int(now.Sub(start).Seconds() * float64(rate))
			if i >= due {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			for ; i < due; i++ {
				_, _ = fl.WriteToUDPAddrPort(dgrams[i%len(dgrams)], lbAddr)
			}
			continue
		}
		for range 256 {
			_, _ = fl.WriteToUDPAddrPort(dgrams[i%len(dgrams)], lbAddr)
			i++
		}
	}
	close(stop)
	wg.Wait()
	res.sent = int64(i)
	res.callsOK, res.callsFailed = ok.Load(), failed.Load()
	res.peakHeap = peak.Load()
	res.kernelDrops = udpSocketDrops(t, ports) - drops0
	// The flood is over: service is whole at once.
	c := newUAC(t, lbAddr)
	if err := tryCall(c.conn, lbAddr, "after-flood"); err != nil {
		t.Errorf("call right after the flood: %v", err)
	}
	m := s.Metrics()
	t.Logf("flood %v at %s: %d datagrams (%.0f/s); calls ok %d failed %d (first error: %v); kernel receive-buffer drops %d; malformed %d, 400 sent %d, dropped unanswered %d, oversize %d, stray responses %d; heap objects %d MB at start, peak %d MB",
		d, rateName(rate), res.sent, float64(res.sent)/d.Seconds(), res.callsOK, res.callsFailed, res.firstErr, res.kernelDrops,
		m.Malformed.Load(), m.BadRequests.Load(), m.MalformedDropped.Load(), m.Oversize.Load(), m.StrayResponses.Load(),
		res.baseHeap>>20, res.peakHeap>>20)
	if m.Panics.Load() != 0 {
		t.Errorf("%d handler panics", m.Panics.Load())
	}
	return res
}

func rateName(rate int) string {
	if rate == 0 {
		return "full speed"
	}
	return strconv.Itoa(rate) + "/s"
}

// TestUDPFloodCallsSurvive: hostile datagrams at 20,000/s while calls run:
// no call is lost unless the kernel dropped a datagram on one of the
// sockets the calls cross (each drop excuses at most one call), calls keep
// completing, memory stays bounded, and a call right after completes.
// SLUICE_FLOOD_RATE (0: full speed) and SLUICE_FLOOD_SECONDS give the long
// run of bench/flood.sh.
func TestUDPFloodCallsSurvive(t *testing.T) {
	rate, secs := 20000, 1.5
	if v := os.Getenv("SLUICE_FLOOD_RATE"); v != "" {
		rate, _ = strconv.Atoi(v)
	}
	if v := os.Getenv("SLUICE_FLOOD_SECONDS"); v != "" {
		secs, _ = strconv.ParseFloat(v, 64)
	}
	if secs <= 0 || secs > 120 {
		t.Fatalf("SLUICE_FLOOD_SECONDS %v: want (0, 120]", secs)
	}
	r := runFlood(t, rate, time.Duration(secs*float64(time.Second)), 4)
	// How many calls fit in the flood depends on the machine (under the
	// race detector on two loaded cores, a handful): the floor is that
	// calls complete; that none fails without a drop is checked below.
	if r.callsOK == 0 {
		t.Fatalf("no call completed during the flood (%d failed)", r.callsFailed)
	}
	if r.callsFailed > r.kernelDrops {
		t.Errorf("%d calls failed and the kernel dropped %d datagrams on the calls' sockets: %d failures unaccounted for (first: %v)",
			r.callsFailed, r.kernelDrops, r.callsFailed-r.kernelDrops, r.firstErr)
	}
	if r.peakHeap > r.baseHeap+256<<20 {
		t.Errorf("heap grew from %d to %d bytes during the flood", r.baseHeap, r.peakHeap)
	}

}
