package sip

import (
	"bytes"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	gosip "github.com/emiago/sipgo/sip"
)

// addMessageSeeds adds every testdata message as a seed.
func addMessageSeeds(f *testing.F) {
	files, _ := filepath.Glob("testdata/*/*.sip")
	for _, p := range files {
		raw, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		s := strings.ReplaceAll(strings.ReplaceAll(string(raw), "\r\n", "\n"), "\n", "\r\n")
		s = strings.ReplaceAll(s, "$VIA", "127.0.0.1:5999")
		s = strings.ReplaceAll(s, "$LEN", "0")
		f.Add([]byte(s))
	}
}

// FuzzParseBackend: the -sip-backend parser never panics and only returns
// values New accepts.
func FuzzParseBackend(f *testing.F) {
	for _, s := range []string{"127.0.0.1:5071", "10.0.0.1:5060,transport=tcp,weight=3,id=b1", "h:1,metrics=http://h/m", ",", "[::1]:5060,weight=0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := ParseBackend(s)
		if err != nil {
			return
		}
		if b.ID == "" || b.Addr == "" || b.Weight < 1 || b.Weight > 1000 || (b.Transport != "udp" && b.Transport != "tcp") {
			t.Fatalf("ParseBackend(%q) = %+v", s, b)
		}
	})
}

// FuzzFrame: stream framing never panics and never claims more bytes than
// it has.
func FuzzFrame(f *testing.F) {
	addMessageSeeds(f)
	f.Add([]byte("INVITE x SIP/2.0\r\nl: 5\r\n\r\nhello"))
	f.Add([]byte("\r\n\r\nContent-Length: 99999999999\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		size, ok, err := frame(b, 65535)
		if err == nil && ok && (size <= 0 || size > len(b)) {
			t.Fatalf("frame size %d of %d bytes", size, len(b))
		}
	})
}

// FuzzRaw400: the 400 builder for unparsable messages never panics and
// answers only requests that are not ACK.
func FuzzRaw400(f *testing.F) {
	addMessageSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		p, ok := raw400(b)
		if !ok {
			return
		}
		if !strings.HasPrefix(string(p), "SIP/2.0 400 Bad Request\r\n") || strings.HasPrefix(string(b), "ACK ") || strings.HasPrefix(string(b), "SIP/") {
			t.Fatalf("raw400(%q) = %q", b, p)
		}
	})
}

// FuzzRoutingKeys: the routing-key helpers on any parsed message never
// panic; the token subject round-trips and branches are deterministic.
var fuzzBrancher = newBrancher(nil)

func ptr[T any](v T) *T { return &v }

func FuzzRoutingKeys(f *testing.F) {
	addMessageSeeds(f)
	p := newParser()
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := p.ParseSIP(b)
		if err != nil || m == nil {
			return
		}
		_ = toTag(m)
		req, ok := m.(*gosip.Request)
		if !ok || req.CallID() == nil {
			return
		}
		cid := req.CallID().Value()
		if req.Via() != nil && req.CSeq() != nil {
			src := source{addr: netip.MustParseAddrPort("127.0.0.1:9")}
			dst := target{addr: netip.MustParseAddrPort("127.0.0.1:10")}
			br := fuzzBrancher.branch(ptr(clientTxnOf(req, src)), loopHash(req), dst)
			if br != fuzzBrancher.branch(ptr(clientTxnOf(req, src)), loopHash(req), dst) || !strings.HasPrefix(br, magicCookie) {
				t.Fatal("branch not deterministic or not RFC 3261")
			}
			k := clientTxnOf(req, src)
			if !fuzzBrancher.verify(br, &k, dst) {
				t.Fatalf("branch %q does not verify", br)
			}
		}
		if id, ok := splitSubject(tokenSubject("b1", cid), cid); !ok || id != "b1" {
			t.Fatalf("subject round trip for %q: %q %v", cid, id, ok)
		}
		_ = dialogCreating(req.Method)
		_ = recordRoutes(req.Method)
		if r := req.Route(); r != nil {
			_ = uriPort(&r.Address)
		}
	})
}

// FuzzHandle feeds any datagram to a running server: nothing panics
// (handleDatagram recovers and counts panics, so a count is a failure), and
// whatever reaches the backend is a SIP message that parses, carries our
// Via on top and keeps its framing: a Content-Length that is the length of
// the body that follows. A message relayed with framing of its own would be
// read differently by the backend than by sluice.
func FuzzHandle(f *testing.F) {
	addMessageSeeds(f)
	backend, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		f.Fatal(err)
	}
	got := make(chan []byte, 1024)
	go func() {
		buf := make([]byte, 65536)
		for {
			n, _, err := backend.ReadFromUDPAddrPort(buf)
			if err != nil {
				close(got)
				return
			}
			select {
			case got <- append([]byte(nil), buf[:n]...):
			default: // checked enough; never block the reader
			}
		}
	}()
	f.Cleanup(func() { backend.Close() })
	s := testServer(f, nil, []string{"name=inv,proto=sip,method=INVITE,limit=5/s,action=reject"}, func(c *Config) {
		c.Backends = []BackendConfig{{ID: "b1", Addr: backend.LocalAddr().String(), Transport: "udp", Weight: 1}}
	})
	ours := s.udpAddr().String()
	src := source{addr: netip.MustParseAddrPort("127.0.0.1:9")}
	f.Fuzz(func(t *testing.T, b []byte) {
		s.handleDatagram(b, src)
		if n := s.metrics.Panics.Load(); n != 0 {
			t.Fatalf("%d handler panics", n)
		}
		for {
			select {
			case m := <-got:
				checkRelayed(t, m, ours, b)
				continue
			default:
			}
			break
		}
	})
}

// checkRelayed fails t unless m, sent by sluice at ours to a backend after
// input in, parses as sluice parses what it receives (the headers it
// reads; a Contact sluice does not read is passed on as it came), has our
// Via on top and a Content-Length equal to its body's length.
func checkRelayed(t *testing.T, m []byte, ours string, in []byte) {
	t.Helper()
	head, body, ok := bytes.Cut(m, []byte("\r\n\r\n"))
	if !ok {
		t.Fatalf("sent to the backend without an end of head after %q:\n%q", in, m)
	}
	msg, err := newParser().ParseSIP(append([]byte(nil), m...))
	if err != nil {
		t.Fatalf("sent to the backend does not parse (%v) after %q:\n%q", err, in, m)
	}
	cl := msg.ContentLength()
	if cl == nil {
		t.Fatalf("sent to the backend without Content-Length after %q:\n%q", in, head)
	}
	if int(*cl) != len(body) {
		t.Fatalf("sent to the backend with Content-Length %d and a %d-byte body after %q:\n%q", *cl, len(body), in, m)
	}
	if req, isReq := msg.(*gosip.Request); isReq {
		via := req.Via()
		if via == nil || via.Host+":"+strconv.Itoa(via.Port) != ours {
			t.Fatalf("request sent to the backend without our Via (%s) on top after %q:\n%q", ours, in, head)
		}
	}
}
