package http

import (
	"bufio"
	"context"
	"net"
	nethttp "net/http"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestHostileTunnelsHoldBackendSlots: one source may hold at most
// MaxConns/8 backend connections at once, so that it cannot take a
// backend's every connection from the others. A tunnel holds its
// backend connection (and its slot under MaxConns) for its whole life,
// so it must count under that share for as long: otherwise one client
// that opens MaxConns WebSockets and keeps them idle (up to TunnelIdle,
// an hour) leaves every other client 503 at that backend.
func TestHostileTunnelsHoldBackendSlots(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		const maxConns = 16 // a source's share: 2
		be := wsEcho(t, false)
		_, addr := tunRig(t, Config{MaxConns: maxConns, ConnWait: 50 * time.Millisecond}, plainBackend(t, be.URL))
		opened := 0
		for range maxConns {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			c, resp, err := websocket.Dial(ctx, "ws://"+addr+"/ws", nil)
			cancel()
			if err != nil {
				if resp == nil || resp.StatusCode != 503 {
					t.Fatalf("tunnel %d: %v %v, want a tunnel or 503", opened, resp, err)
				}
				continue
			}
			t.Cleanup(func() { c.CloseNow() })
			opened++
		}
		if opened > maxConns/8 {
			t.Errorf("one source holds %d tunnels, so %d backend connections: want at most MaxConns/8 = %d", opened, opened, maxConns/8)
		}
		// Another client is still served by that backend.
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 5 * time.Second}
		vc, err := d.Dial("tcp", addr)
		if err != nil {
			t.Skipf("no second loopback source: %v", err)
		}
		defer vc.Close()
		vc.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := vc.Write([]byte("GET /plain HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		res, err := nethttp.ReadResponse(bufio.NewReader(vc), nil)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Errorf("another source got %d %s (%s) while one source holds %d tunnels", res.StatusCode, res.Status, res.Header.Get("Proxy-Status"), opened)
		}
	})
}
