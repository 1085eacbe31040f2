package sip

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"
)

// TestNoGrowthPerDialog: the affinity lives in the token; the dialog
// table keeps an ended call only for the BYE linger. After 10,000
// complete calls no transaction is left, no dialog once the linger is
// over, and neither the live heap nor the goroutine count grew with the
// number of calls.
func TestNoGrowthPerDialog(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 calls")
	}
	b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
	b1.drop.Store(true)
	b2.drop.Store(true)
	// A load test, run beside the race detector and other packages' tests
	// on two cores: the test server's 300 ms failover timeout, passed on
	// both backends, made the balancer answer 500 (every backend failed)
	// to a call now and then. What this test counts is memory per call.
	s := testServer(t, []*uas{b1, b2}, nil, func(c *Config) { c.FailoverTimeout = 10 * time.Second })
	const workers = 8
	run := func(calls int) {
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			c := newUAC(t, s.udpAddr())
			go func() {
				defer wg.Done()
				for i := 0; i < calls/workers; i++ {
					c.newCall().completeUnderLoad()
				}
			}()
		}
		wg.Wait()
	}
	heap := func() uint64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	run(1000) // warm up pools and maps
	h0, g0 := heap(), runtime.NumGoroutine()
	run(10000)
	eventually(t, "transactions to end", func() bool { return s.txns.Len() == 0 })
	s.dialogs.sweepAll(s.clock.Now() + int64(dialogLinger))
	s.txns.mu.Lock()
	s.txns.accepted.expireLocked(s.clock.Now() + 2*int64(acceptedLinger)) // the Accepted state is over
	s.txns.mu.Unlock()
	if n := s.dialogs.Len(); n != 0 {
		t.Errorf("%d dialogs left after the BYE linger; %s", n, describeDialogs(&s.dialogs, s.clock.Now(), 5))
	}
	h1, g1 := heap(), runtime.NumGoroutine()
	t.Logf("heap %d -> %d bytes, goroutines %d -> %d", h0, h1, g0, g1)
	// 10,000 dialogs kept at even 100 bytes each would add 1 MB. The
	// dialog table's maps keep the room of their peak (at most the 11,000
	// calls lingering at once, 35 to 54 bytes each: 0.6 MB at worst).
	if h1 > h0+1<<20 {
		t.Errorf("live heap grew by %d bytes over 10,000 calls", h1-h0)
	}
	if g1 > g0 {
		t.Errorf("goroutines grew from %d to %d", g0, g1)
	}
	if got := s.metrics.Forwarded.Load(); got < 11000*3 {
		t.Errorf("forwarded %d requests, want at least %d", got, 11000*3)
	}
}

// completeUnderLoad is complete for load tests: it waits for the final
// answer of each request of this call by its CSeq method, passing over
// provisional answers, duplicates and answers to earlier calls. Loopback
// UDP drops a datagram now and then on a loaded machine (a lost 180 is no
// lost call: the 200 still ends the INVITE), and a backend slower than
// Timer A answers the balancer's retransmitted INVITE a second time: that
// second 200 reaches the client (2xx retransmissions pass, RFC 3261
// §16.7) while it already waits for the next call's. Taking it for the
// next call's 200 sent that call's BYE with the earlier call's token (403)
// and left its dialog open. The call is what this test counts, not each
// provisional answer.
func (k *call) completeUnderLoad() {
	k.c.t.Helper()
	k.invite("")
	ok := k.finalTo(gosip.INVITE, 200)
	k.learn(ok)
	k.inDialog("ACK", 1, k.branch+"-ack")
	k.inDialog("BYE", 2, k.branch+"-bye")
	k.finalTo(gosip.BYE, 200)
}

// finalTo waits for the final answer to this call's request of method,
// skipping provisional answers and answers to other methods or calls; a
// final answer other than code fails the test.
func (k *call) finalTo(method gosip.RequestMethod, code int) *gosip.Response {
	c := k.c
	c.t.Helper()
	for {
		m := c.recv()
		if m == nil {
			c.t.Fatalf("no %d response to %s of %s", code, method, k.callID)
			return nil
		}
		res, ok := m.(*gosip.Response)
		if !ok || res.StatusCode < 200 || res.CSeq() == nil || res.CSeq().MethodName != method ||
			res.CallID() == nil || res.CallID().Value() != k.callID {
			continue
		}
		if res.StatusCode != code {
			c.t.Fatalf("got %d %s to %s of %s, want %d", res.StatusCode, res.Reason, method, k.callID, code)
		}
		return res
	}
}

// describeDialogs says what the entries left in dt are, for a failure
// message: how many are confirmed, lingering, and how far their deadlines
// are, and a few of them.
func describeDialogs(dt *dialogTable, now int64, samples int) string {
	var confirmed, lingering, n int
	var out strings.Builder
	for i := range dt.shards {
		sh := &dt.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			n++
			if e.toTag != 0 {
				confirmed++
			}
			if e.linger() {
				lingering++
			}
			if samples > 0 {
				samples--
				fmt.Fprintf(&out, " [key %x backend %q src %d toTag %x linger %v deadline in %v]", k,
					dt.ids.Load().ids[e.backend()], e.src, e.toTag, e.linger(), time.Duration(e.deadline-now))
			}
		}
		sh.mu.Unlock()
	}
	return fmt.Sprintf("%d in the maps, %d confirmed, %d lingering:%s", n, confirmed, lingering, out.String())
}
