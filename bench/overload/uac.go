package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/emiago/sipgo/sip"
)

// uac is a SIP user agent client over UDP on loopback, enough for load:
// INVITE, ACK, re-INVITE and BYE through a record-routing proxy, with
// RFC 3261 retransmission (Timer A from 500 ms, doubling; a provisional
// answer stops it) and responses matched to requests by Via branch. Several
// sockets spread the reading.
type uac struct {
	conns []*net.UDPConn
	lb    *net.UDPAddr

	mu      sync.Mutex
	pending map[string]chan *sip.Response // by Via branch

	seq      atomic.Uint64
	retrans  atomic.Uint64 // requests sent again (Timer A)
	stray    atomic.Uint64 // responses matching no pending request
	badInput atomic.Uint64 // datagrams that did not parse
	readers  sync.WaitGroup
}

// errTimeout is a request that got no final answer within the bound.
var errTimeout = errors.New("no final response")

func newUAC(lb string, sockets int) (*uac, error) {
	lbAddr, err := net.ResolveUDPAddr("udp", lb)
	if err != nil {
		return nil, fmt.Errorf("sip target %q: %w", lb, err)
	}
	u := &uac{lb: lbAddr, pending: map[string]chan *sip.Response{}}
	for range sockets {
		c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			u.close()
			return nil, fmt.Errorf("sip client socket: %w", err)
		}
		_ = c.SetReadBuffer(8 << 20)
		_ = c.SetWriteBuffer(8 << 20)
		u.conns = append(u.conns, c)
		u.readers.Add(1)
		go u.read(c)
	}
	return u, nil
}

func (u *uac) close() {
	for _, c := range u.conns {
		c.Close()
	}
	u.readers.Wait()
}

// read delivers responses to their waiting request until the socket closes.
func (u *uac) read(c *net.UDPConn) {
	defer u.readers.Done()
	buf := make([]byte, 65536)
	for {
		n, _, err := c.ReadFromUDP(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		m, err := sip.ParseMessage(buf[:n])
		if err != nil {
			u.badInput.Add(1)
			continue
		}
		res, ok := m.(*sip.Response)
		if !ok {
			continue // no requests are expected: the UAS sends none
		}
		via := res.Via()
		if via == nil {
			u.stray.Add(1)
			continue
		}
		branch, _ := via.Params.Get("branch")
		u.mu.Lock()
		ch := u.pending[branch]
		if ch != nil && res.StatusCode >= 200 {
			delete(u.pending, branch)
		}
		u.mu.Unlock()
		if ch == nil {
			u.stray.Add(1)
			continue
		}
		select {
		case ch <- res:
		default:
		}
	}
}

// dialog is one call from the client's side.
type dialog struct {
	conn    *net.UDPConn
	local   string // host:port of conn
	callID  string
	fromTag string
	toTag   string
	route   []string // route set from the 2xx's Record-Route, reversed
	target  string   // remote target (Contact of the 2xx)
	cseq    int
}

func (u *uac) newDialog(kind string) *dialog {
	n := u.seq.Add(1)
	c := u.conns[int(n)%len(u.conns)]
	local := c.LocalAddr().String()
	return &dialog{conn: c, local: local, callID: fmt.Sprintf("%s-%d-%d@overload", kind, c.LocalAddr().(*net.UDPAddr).Port, n),
		fromTag: fmt.Sprintf("f%d", n), cseq: 1}
}

func (u *uac) branch() string { return fmt.Sprintf("z9hG4bK-ovl-%d", u.seq.Add(1)) }

func (u *uac) send(c *net.UDPConn, msg string) error {
	_, err := c.WriteToUDP([]byte(msg), u.lb)
	return err
}

// transact sends msg (whose Via carries branch) and waits for its final
// response, retransmitting until a provisional answer arrives. The wait is
// bounded by limit and ctx.
func (u *uac) transact(ctx context.Context, c *net.UDPConn, branch, msg string, limit time.Duration) (*sip.Response, error) {
	ch := make(chan *sip.Response, 8)
	u.mu.Lock()
	u.pending[branch] = ch
	u.mu.Unlock()
	defer func() {
		u.mu.Lock()
		if u.pending[branch] == ch {
			delete(u.pending, branch)
		}
		u.mu.Unlock()
	}()
	if err := u.send(c, msg); err != nil {
		return nil, err
	}
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	interval := 500 * time.Millisecond
	retry := time.NewTimer(interval)
	defer retry.Stop()
	for {
		select {
		case res := <-ch:
			if res.StatusCode >= 200 {
				return res, nil
			}
			retry.Stop() // proceeding: the proxy or server has it
		case <-retry.C:
			u.retrans.Add(1)
			if err := u.send(c, msg); err != nil {
				return nil, err
			}
			interval = min(2*interval, 4*time.Second)
			retry.Reset(interval)
		case <-deadline.C:
			return nil, errTimeout
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// invite sends the dialog-creating INVITE. On a 2xx the dialog learns its
// state and is acknowledged; on a final failure the INVITE is acknowledged
// hop by hop (RFC 3261 §17.1.1.3) and the response returned as is.
func (u *uac) invite(ctx context.Context, d *dialog, limit time.Duration) (*sip.Response, error) {
	br := u.branch()
	msg := fmt.Sprintf("INVITE sip:service@%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nMax-Forwards: 70\r\nFrom: <sip:load@overload>;tag=%s\r\nTo: <sip:service@overload>\r\nCall-ID: %s\r\nCSeq: %d INVITE\r\nContact: <sip:load@%s>\r\nContent-Length: 0\r\n\r\n",
		u.lb, d.local, br, d.fromTag, d.callID, d.cseq, d.local)
	res, err := u.transact(ctx, d.conn, br, msg, limit)
	if err != nil {
		return nil, err
	}
	if res.StatusCode < 300 {
		d.learn(res)
		return res, u.ack(d)
	}
	toTag := ""
	if to := res.To(); to != nil {
		if tag, ok := to.Params.Get("tag"); ok {
			toTag = ";tag=" + tag
		}
	}
	ack := fmt.Sprintf("ACK sip:service@%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nMax-Forwards: 70\r\nFrom: <sip:load@overload>;tag=%s\r\nTo: <sip:service@overload>%s\r\nCall-ID: %s\r\nCSeq: %d ACK\r\nContent-Length: 0\r\n\r\n",
		u.lb, d.local, br, d.fromTag, toTag, d.callID, d.cseq)
	return res, u.send(d.conn, ack)
}

// learn takes the dialog state from a 2xx (RFC 3261 §12.1.2).
func (d *dialog) learn(res *sip.Response) {
	if to := res.To(); to != nil {
		d.toTag, _ = to.Params.Get("tag")
	}
	d.route = nil
	for _, h := range res.GetHeaders("Record-Route") {
		d.route = append([]string{h.Value()}, d.route...)
	}
	if h := res.GetHeader("Contact"); h != nil {
		d.target = strings.Trim(h.Value(), "<>")
	}
}

// inDialog builds an in-dialog request with the learned route set.
func (d *dialog) inDialog(method, branch string, cseq int) string {
	var routes strings.Builder
	for _, r := range d.route {
		routes.WriteString("Route: " + r + "\r\n")
	}
	return fmt.Sprintf("%s %s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nMax-Forwards: 70\r\n%sFrom: <sip:load@overload>;tag=%s\r\nTo: <sip:service@overload>;tag=%s\r\nCall-ID: %s\r\nCSeq: %d %s\r\nContact: <sip:load@%s>\r\nContent-Length: 0\r\n\r\n",
		method, d.target, d.local, branch, routes.String(), d.fromTag, d.toTag, d.callID, cseq, method, d.local)
}

// ack acknowledges the dialog's last INVITE 2xx (its own transaction).
func (u *uac) ack(d *dialog) error {
	return u.send(d.conn, d.inDialog("ACK", u.branch(), d.cseq))
}

// reinvite refreshes the dialog: a re-INVITE, which the demo UAS answers
// 200 only for a dialog it holds (481 otherwise, as any other backend
// would), then the ACK.
func (u *uac) reinvite(ctx context.Context, d *dialog, limit time.Duration) (*sip.Response, error) {
	d.cseq++
	br := u.branch()
	res, err := u.transact(ctx, d.conn, br, d.inDialog("INVITE", br, d.cseq), limit)
	if err != nil {
		return nil, err
	}
	if res.StatusCode < 300 {
		return res, u.ack(d)
	}
	return res, nil
}

// bye ends the dialog.
func (u *uac) bye(ctx context.Context, d *dialog, limit time.Duration) (*sip.Response, error) {
	d.cseq++
	br := u.branch()
	return u.transact(ctx, d.conn, br, d.inDialog("BYE", br, d.cseq), limit)
}
