package sip

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	gosip "github.com/emiago/sipgo/sip"
)

// loadMessage reads a testdata message: LF line ends become CRLF, $VIA is
// the client's address, $LEN the body's length.
func loadMessage(t *testing.T, path, via string) []byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.ReplaceAll(string(raw), "\r\n", "\n")
	s = strings.ReplaceAll(s, "\n", "\r\n")
	s = strings.ReplaceAll(s, "$VIA", via)
	if _, body, ok := strings.Cut(s, "\r\n\r\n"); ok {
		s = strings.ReplaceAll(s, "$LEN", strconv.Itoa(len(body)))
	}
	return []byte(s)
}

// ping sends an OPTIONS to the balancer itself; its 200 arrives after any
// answer to what was sent before (one reader keeps the order).
func (c *uac) ping(tag string) {
	c.send(fmt.Sprintf("OPTIONS sip:%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-ping-%s\r\nMax-Forwards: 70\r\nFrom: <sip:t@test>;tag=p\r\nTo: <sip:%s>\r\nCall-ID: ping-%s@test\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n", c.lb, c.addr, tag, c.lb, tag))
}

// untilPing collects the status codes received before the ping's 200.
func (c *uac) untilPing(t *testing.T, tag string) []int {
	t.Helper()
	var codes []int
	for {
		m := c.recv()
		if m == nil {
			t.Fatal("ping answer missing")
		}
		res, ok := m.(*gosip.Response)
		if !ok {
			continue
		}
		if res.CallID() != nil && res.CallID().Value() == "ping-"+tag+"@test" {
			return codes
		}
		codes = append(codes, res.StatusCode)
	}
}

// TestTortureValid: valid but unusual messages (in the spirit of RFC 4475)
// are forwarded with method, Call-ID, body and unknown headers intact.
func TestTortureValid(t *testing.T) {
	files, _ := filepath.Glob("testdata/valid/*.sip")
	if len(files) == 0 {
		t.Fatal("no test messages")
	}
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, nil)
	c := newUAC(t, s.udpAddr())
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data := loadMessage(t, f, c.addr.String())
			want, err := gosip.ParseMessage(data)
			if err != nil {
				t.Fatalf("sipgo cannot parse the test message: %v", err)
			}
			wreq := want.(*gosip.Request)
			if _, err := c.conn.WriteToUDPAddrPort(data, s.udpAddr()); err != nil {
				t.Fatal(err)
			}
			id := wreq.CallID().Value()
			eventually(t, "the backend to get it", func() bool { return b1.count(wreq.Method, id) == 1 })
			got := b1.find(wreq.Method, id)[0].Req
			if string(got.Body()) != string(wreq.Body()) {
				t.Errorf("body %q, want %q", got.Body(), wreq.Body())
			}
			if got.Recipient.String() != wreq.Recipient.String() {
				t.Errorf("Request-URI %s, want %s", got.Recipient.String(), wreq.Recipient.String())
			}
			for _, h := range wreq.Headers() {
				name := strings.ToLower(h.Name())
				switch name {
				case "via", "v", "max-forwards", "record-route", "content-length", "l":
					continue
				}
				g := got.GetHeaders(h.Name())
				found := false
				for _, x := range g {
					found = found || x.Value() == h.Value()
				}
				if !found {
					t.Errorf("header %s: %q missing (got %v)", h.Name(), h.Value(), g)
				}
			}
			if n := len(got.GetHeaders("Via")); n != len(wreq.GetHeaders("Via"))+1 {
				t.Errorf("%d Vias, want ours plus %d", n, len(wreq.GetHeaders("Via")))
			}
		})
	}
}

// TestTortureInvalid: invalid messages get 400 when an answer can be
// addressed (400-*.sip) and are dropped otherwise (drop-*.sip); none
// reaches a backend and each is counted.
func TestTortureInvalid(t *testing.T) {
	files, _ := filepath.Glob("testdata/invalid/*.sip")
	if len(files) == 0 {
		t.Fatal("no test messages")
	}
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, nil)
	c := newUAC(t, s.udpAddr())
	for i, f := range files {
		name := filepath.Base(f)
		t.Run(name, func(t *testing.T) {
			before := s.metrics.Malformed.Load()
			if _, err := c.conn.WriteToUDPAddrPort(loadMessage(t, f, c.addr.String()), s.udpAddr()); err != nil {
				t.Fatal(err)
			}
			tag := strconv.Itoa(i)
			c.ping(tag)
			codes := c.untilPing(t, tag)
			switch {
			case strings.HasPrefix(name, "400-"):
				if len(codes) != 1 || codes[0] != 400 {
					t.Errorf("got %v, want one 400", codes)
				}
			case strings.HasPrefix(name, "drop-"):
				if len(codes) != 0 {
					t.Errorf("got %v, want no answer", codes)
				}
			}
			if s.metrics.Malformed.Load() == before {
				t.Error("not counted as malformed")
			}
		})
	}
	if n := len(b1.seen); n != 0 {
		t.Errorf("backend got %d invalid requests", n)
	}
}

// TestOversizeDatagram: a request datagram over -sip-max-message is
// answered 513 Message Too Large (RFC 3261 §21.4.11), counted and not
// forwarded.
func TestOversizeDatagram(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, func(c *Config) { c.MaxMessage = 2048 })
	c := newUAC(t, s.udpAddr())
	big := fmt.Sprintf("OPTIONS sip:b@example.com SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-big\r\nMax-Forwards: 70\r\nFrom: <sip:a@test>;tag=1\r\nTo: <sip:b@example.com>\r\nCall-ID: big@test\r\nCSeq: 1 OPTIONS\r\nX-Pad: %s\r\nContent-Length: 0\r\n\r\n", c.addr, strings.Repeat("p", 4000))
	c.send(big)
	c.ping("big")
	if codes := c.untilPing(t, "big"); len(codes) != 1 || codes[0] != 513 {
		t.Errorf("got %v for an oversize datagram, want [513]", codes)
	}
	if s.metrics.Oversize.Load() != 1 || len(b1.seen) != 0 {
		t.Errorf("oversize %d, backend got %d", s.metrics.Oversize.Load(), len(b1.seen))
	}
}
