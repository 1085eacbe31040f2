package http

import (
	"bufio"
	"fmt"
	"io"
	"net"
	nethttp "net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicelb/sluice/proxyproto"
)

// proxyReader serves a backend connection that must start with a PROXY
// header: each request is answered with the header's version and client
// address and the number of the connection, "v2 203.0.113.7:40000 #1";
// a connection without a valid header is closed.
func proxyReader(conns *atomic.Int32) func(net.Conn) {
	return func(c net.Conn) {
		h, err := proxyproto.Read(c, nil)
		if err != nil {
			return
		}
		n := conns.Add(1)
		br := bufio.NewReader(c)
		for {
			req, err := nethttp.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			body := fmt.Sprintf("v%d %s #%d", h.Version, h.Source, n)
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		}
	}
}

// TestProxyProtocolOut: a backend with proxy=v1|v2 gets a header naming
// the client (the one a balancer's header named, here) on each connection,
// and a connection carries one client's requests only: on the loop a
// client's keep-alive requests share its own connection; on the fasthttp
// engine each request has one.
func TestProxyProtocolOut(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		for _, v := range []uint8{1, 2} {
			t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) {
				var conns atomic.Int32
				r := newRig(t, rigOpts{backends: 1, raw: proxyReader(&conns), proxy: v,
					cfg: Config{ProxyFrom: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}})
				client := func(src string, requests int) []string {
					c, err := net.Dial("tcp", r.addr)
					if err != nil {
						t.Fatal(err)
					}
					defer c.Close()
					c.SetDeadline(time.Now().Add(10 * time.Second))
					io.WriteString(c, string(proxyproto.AppendV2(nil, netip.MustParseAddrPort(src), netip.MustParseAddrPort("127.0.0.1:80"))))
					br := bufio.NewReader(c)
					var got []string
					for range requests {
						io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
						resp, err := nethttp.ReadResponse(br, nil)
						if err != nil {
							t.Fatal(err)
						}
						b, _ := io.ReadAll(resp.Body)
						got = append(got, string(b))
					}
					return got
				}
				a := client("203.0.113.7:40000", 2)
				b := client("198.51.100.9:555", 1)
				perReq := engineOf(t) == EngineFastHTTP
				wantA := []string{fmt.Sprintf("v%d 203.0.113.7:40000 #1", v), fmt.Sprintf("v%d 203.0.113.7:40000 #1", v)}
				wantB := fmt.Sprintf("v%d 198.51.100.9:555 #2", v)
				if perReq {
					wantA[1] = fmt.Sprintf("v%d 203.0.113.7:40000 #2", v)
					wantB = fmt.Sprintf("v%d 198.51.100.9:555 #3", v)
				}
				if strings.Join(a, "|") != strings.Join(wantA, "|") || len(b) != 1 || b[0] != wantB {
					t.Fatalf("backend saw %q then %q, want %q then %q", a, b, wantA, wantB)
				}
			})
		}
	})
}
