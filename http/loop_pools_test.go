//go:build linux

package http

import (
	"fmt"
	"io"
	"net"
	nethttp "net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sluicelb/sluice/lb"
)

// TestSlotsForgotten: an address's connection count is forgotten once
// nobody refers to it and no connection of it is open, and never before:
// a count forgotten while a slot is taken, or while a loop's pool may
// still take one, would let a new count start from 0 beside it and the
// backend get more than -http-backend-max-conns.
func TestSlotsForgotten(t *testing.T) {
	const a = "192.0.2.1:80"
	for _, tc := range []struct {
		name string
		run  func(s *Server) // leaves the state to check
		kept bool
	}{
		{"referred to, nothing taken", func(s *Server) { s.backendSlots(a) }, true},
		{"reference given back", func(s *Server) { s.dropSlots(a, s.backendSlots(a)) }, false},
		{"slot taken, reference given back", func(s *Server) {
			b := s.backendSlots(a)
			b.take(10)
			s.dropSlots(a, b)
		}, true},
		{"slot taken and freed", func(s *Server) {
			b := s.backendSlots(a)
			b.take(10)
			s.dropSlots(a, b)
			s.releaseSlot(a, b)
		}, false},
		{"slot freed while a pool refers to it", func(s *Server) {
			pool := s.backendSlots(a)
			b := s.backendSlots(a)
			b.take(10)
			s.dropSlots(a, b)
			s.releaseSlot(a, b)
			_ = pool
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Server{}
			tc.run(s)
			s.slotsMu.Lock()
			_, kept := s.slots[a]
			s.slotsMu.Unlock()
			if kept != tc.kept {
				t.Errorf("entry kept %v, want %v", kept, tc.kept)
			}
		})
	}
}

// TestLoopForgetsUnusedPools: a loop's pool of an address that left the
// backends (a reload, DNS) is forgotten with the address's count once it
// has no connection and carried no request for poolForgetAfter, while the
// pools of the backends in force are kept; the address is served as
// before when it comes back.
func TestLoopForgetsUnusedPools(t *testing.T) {
	r := loopRig(t, rigOpts{backends: 2, policy: "round-robin", cfg: Config{BackendIdle: 100 * time.Millisecond}})
	r.srv.poolForget.Store(0)
	keep, gone := r.backends[0], r.backends[1]
	state := func(addr string) (pools int, count bool) {
		for _, l := range r.srv.loops.Load().loops {
			done := make(chan int)
			l.post(func() {
				n := 0
				for _, p := range l.connPools {
					if p.addr == addr {
						n++
					}
				}
				done <- n
			})
			pools += <-done
		}
		r.srv.slotsMu.Lock()
		_, count = r.srv.slots[addr]
		r.srv.slotsMu.Unlock()
		return pools, count
	}
	pool := func(bes ...*backend) *lb.Pool {
		var bs []*lb.Backend
		for _, be := range bes {
			b, err := lb.NewBackend(lb.BackendConfig{ID: be.name, Addr: be.addr(), Proto: "http"})
			if err != nil {
				t.Fatal(err)
			}
			bs = append(bs, b)
		}
		p, err := lb.NewPool(lb.PoolConfig{Policy: "round-robin"}, bs)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	getBoth := func(round int) {
		t.Helper()
		before := gone.hits.Load()
		for range 4 {
			if rep := r.get("/", ""); rep.status != 200 {
				t.Fatalf("round %d: GET: %d %q", round, rep.status, rep.body)
			}
		}
		if gone.hits.Load() == before {
			t.Fatalf("round %d: backend %s took none of 4 requests (round-robin over 2)", round, gone.name)
		}
	}
	for round := range 2 {
		getBoth(round)
		if err := r.srv.SetPool(pool(keep)); err != nil {
			t.Fatal(err)
		}
		// gone's connection idles out (BackendIdle), then its pool and
		// count go at the next tick; bounded.
		deadline := time.Now().Add(10 * time.Second)
		for {
			pools, count := state(gone.addr())
			if pools == 0 && !count {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d pools of %s, its count kept %v, 10s after it left the backends; want none", round, pools, gone.addr(), count)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if pools, count := state(keep.addr()); pools == 0 || !count {
			t.Fatalf("round %d: the backend in force has %d pools, count kept %v; want its pool kept", round, pools, count)
		}
		if err := r.srv.SetPool(pool(keep, gone)); err != nil { // it comes back
			t.Fatal(err)
		}
	}
	getBoth(2)
}

// TestTLSBackendSlots: a TLS backend's connection slot is freed once, when
// the connection to the backend has closed (the loop engine's bridge frees
// it itself, after the loop closed its end): with one connection allowed
// and every answer closing its connection, requests one after another and
// at once are all answered, none waiting out -http-backend-conn-wait for a
// slot never given back, and the count comes back to 0, not below (a slot
// freed twice would let more connections than the limit be opened).
func TestTLSBackendSlots(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		srv := httptest.NewUnstartedServer(nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) {
			w.Header().Set("Connection", "close")
			io.WriteString(w, "ok")
		}))
		srv.StartTLS()
		t.Cleanup(srv.Close)
		s, addr := tunRig(t, Config{MaxConns: 1, ConnWait: 5 * time.Second}, tlsBackend(t, srv, srv))
		// Each request from a source address of its own: a source holds
		// at most an eighth of -http-backend-max-conns (at least 1), until
		// its exchange is over, which on the loop may come just after the
		// client read the answer and sent its next request.
		get := func(src int) error {
			d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+src))}}
			c := &nethttp.Client{Transport: &nethttp.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
			resp, err := c.Get("http://" + addr + "/")
			if err != nil {
				return err
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(body) != "ok" {
				return fmt.Errorf("%d %q", resp.StatusCode, body)
			}
			return nil
		}
		for i := range 10 {
			if err := get(i); err != nil {
				t.Fatalf("request %d one after another: %v", i, err)
			}
		}
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for i := range 8 {
			wg.Add(1)
			go func() { defer wg.Done(); errs <- get(10 + i) }()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("request at once: %v", err)
			}
		}
		backend := srv.Listener.Addr().String()
		count := func() int64 {
			s.slotsMu.Lock()
			defer s.slotsMu.Unlock()
			if b := s.slots[backend]; b != nil {
				return b.n.Load()
			}
			return 0 // forgotten: none open
		}
		deadline := time.Now().Add(10 * time.Second)
		for n := count(); n != 0; n = count() {
			if n < 0 || time.Now().After(deadline) {
				t.Fatalf("%d connections counted to the backend after every answer closed its own, want 0", n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}
