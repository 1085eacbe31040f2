package sip

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/emiago/sipgo"
	gosip "github.com/emiago/sipgo/sip"
)

// newSipgoUA returns a sipgo user agent serving UDP on 127.0.0.1:0, quiet.
func newSipgoUA(t *testing.T) (*sipgo.UserAgent, net.PacketConn) {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	ua, err := sipgo.NewUA(
		sipgo.WithUserAgentHostname("127.0.0.1"),
		sipgo.WithUserAgentTransportLayerOptions(gosip.WithTransportLayerLogger(quiet)),
		sipgo.WithUserAgentTransactionLayerOptions(
			gosip.WithTransactionLayerLogger(quiet),
			gosip.WithTransactionLayerUnhandledResponseHandler(func(*gosip.Response) {}),
		),
	)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ua, pc
}

// sipgoUAS is a backend built on sipgo's server: 180 and 200 to INVITE,
// 200 to BYE. It counts the requests per Call-ID.
type sipgoUAS struct {
	addr string
	mu   sync.Mutex
	got  map[string][]gosip.RequestMethod
}

func newSipgoUAS(t *testing.T) *sipgoUAS {
	t.Helper()
	ua, pc := newSipgoUA(t)
	srv, err := sipgo.NewServer(ua, sipgo.WithServerLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	u := &sipgoUAS{addr: pc.LocalAddr().String(), got: map[string][]gosip.RequestMethod{}}
	note := func(req *gosip.Request) {
		u.mu.Lock()
		u.got[req.CallID().Value()] = append(u.got[req.CallID().Value()], req.Method)
		u.mu.Unlock()
	}
	host, port, _ := net.SplitHostPort(u.addr)
	p, _ := strconv.Atoi(port)
	contact := &gosip.ContactHeader{Address: gosip.Uri{Scheme: "sip", User: "bob", Host: host, Port: p}}
	srv.OnInvite(func(req *gosip.Request, tx gosip.ServerTransaction) {
		note(req)
		tag := "sipgo-" + req.CallID().Value()
		for _, code := range []int{180, 200} {
			res := gosip.NewResponseFromRequest(req, code, "", nil)
			res.To().Params.Add("tag", tag)
			res.AppendHeader(contact)
			if err := tx.Respond(res); err != nil {
				return
			}
		}
	})
	srv.OnAck(func(req *gosip.Request, tx gosip.ServerTransaction) { note(req) })
	srv.OnBye(func(req *gosip.Request, tx gosip.ServerTransaction) {
		note(req)
		_ = tx.Respond(gosip.NewResponseFromRequest(req, 200, "OK", nil))
	})
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.ServeUDP(pc)
	}()
	t.Cleanup(func() {
		pc.Close()
		<-served
		srv.Close()
		ua.Close()
	})
	return u
}

func (u *sipgoUAS) methods(callID string) []gosip.RequestMethod {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]gosip.RequestMethod(nil), u.got[callID]...)
}

// TestSipgoDialogs: sipgo's own UAC (DialogUA, with a pre-loaded route to
// the balancer) and sipgo servers as backends. INVITE, ACK and BYE of each
// dialog reach the same backend; sipgo takes the route set from our
// Record-Route.
func TestSipgoDialogs(t *testing.T) {
	be1, be2 := newSipgoUAS(t), newSipgoUAS(t)
	s := testServer(t, nil, nil, func(c *Config) {
		c.Backends = []BackendConfig{{ID: "s1", Addr: be1.addr, Transport: "udp", Weight: 1}, {ID: "s2", Addr: be2.addr, Transport: "udp", Weight: 1}}
	})
	ua, pc := newSipgoUA(t)
	served := make(chan struct{})
	go func() {
		defer close(served)
		ua.TransportLayer().ServeUDP(pc)
	}()
	t.Cleanup(func() {
		pc.Close()
		<-served
		ua.Close()
	})
	for i := 0; ; i++ { // requests must find the listener in the pool
		if c, _ := ua.TransportLayer().GetConnection("udp", pc.LocalAddr().String()); c != nil {
			break
		}
		if i == 10000 {
			t.Fatal("listener never served")
		}
		time.Sleep(100 * time.Microsecond)
	}
	client, err := sipgo.NewClient(ua, sipgo.WithClientConnectionAddr(pc.LocalAddr().String()), sipgo.WithClientLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	dua := &sipgo.DialogUA{Client: client, ContactHDR: gosip.ContactHeader{Address: gosip.Uri{User: "alice", Host: "127.0.0.1", Port: pc.LocalAddr().(*net.UDPAddr).Port}}}
	lbAddr := s.udpAddr()
	route := &gosip.RouteHeader{Address: gosip.Uri{Scheme: "sip", Host: "127.0.0.1", Port: int(lbAddr.Port()), UriParams: gosip.HeaderParams{{K: "lr"}}}}
	used := map[*sipgoUAS]int{}
	for i := 0; i < 24; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		sess, err := dua.Invite(ctx, gosip.Uri{Scheme: "sip", User: "bob", Host: "service.example.com"}, []byte("v=0\r\n"), route.Clone(),
			gosip.NewHeader("Content-Type", "application/sdp"))
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		if err := sess.WaitAnswer(ctx, sipgo.AnswerOptions{}); err != nil {
			cancel()
			t.Fatalf("call %d: %v", i, err)
		}
		if err := sess.Ack(ctx); err != nil {
			t.Fatalf("call %d ack: %v", i, err)
		}
		if err := sess.Bye(ctx); err != nil {
			t.Fatalf("call %d bye: %v", i, err)
		}
		sess.Close()
		cancel()
		id := sess.InviteRequest.CallID().Value()
		home := be1
		if len(be1.methods(id)) == 0 {
			home = be2
		}
		used[home]++
		eventually(t, "INVITE, ACK and BYE at one backend", func() bool { return len(home.methods(id)) == 3 })
		// sipgo's server runs each request's handler on its own goroutine,
		// so ACK and BYE may be noted in either order.
		seen := map[gosip.RequestMethod]bool{}
		for _, m := range home.methods(id) {
			seen[m] = true
		}
		if !seen[gosip.INVITE] || !seen[gosip.ACK] || !seen[gosip.BYE] {
			t.Errorf("call %d: backend got %v", i, home.methods(id))
		}
	}
	if len(used) != 2 {
		t.Errorf("calls per backend %v: want both used", used)
	}
}
