package http

import (
	"io"
	"net"
	nethttp "net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// TestLoopToSelfRefused: a backend that leads back to the balancer itself
// (here a TCP relay to its own listener) costs one forward and one 508,
// not connections until the file descriptors run out.
func TestLoopToSelfRefused(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		var self atomic.Value // the rig's own address, once known
		relay := func(c net.Conn) {
			addr, _ := self.Load().(string)
			if addr == "" {
				return
			}
			up, err := net.Dial("tcp", addr)
			if err != nil {
				return
			}
			defer up.Close()
			go io.Copy(up, c)
			io.Copy(c, up)
		}
		r := newRig(t, rigOpts{backends: 1, raw: relay})
		self.Store(r.addr)
		got := r.get("/", "")
		if got.status != nethttp.StatusLoopDetected {
			t.Fatalf("status %d (%q), want 508", got.status, got.body)
		}
		if ps := got.header.Get("Proxy-Status"); !strings.Contains(ps, "error=proxy_loop_detected") {
			t.Errorf("Proxy-Status %q, want error=proxy_loop_detected", ps)
		}
		if n := r.srv.stats.Loops.Load(); n != 1 {
			t.Errorf("Loops = %d, want 1", n)
		}
		if n := r.backends[0].hits.Load(); n != 1 {
			t.Errorf("the looping backend was connected to %d times, want 1", n)
		}
	})
}

// TestForeignLoopMarkPasses: marks of other balancers (a chain of distinct
// sluices) are no loop; the request is forwarded.
func TestForeignLoopMarkPasses(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1})
		req, _ := nethttp.NewRequest("GET", "http://"+r.addr+"/", nil)
		req.Header.Add("Sluice-Via", "0123456789abcdef")
		req.Header.Add("sluice-via", "fedcba9876543210")
		resp, err := r.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d, want 200", resp.StatusCode)
		}
		if n := r.srv.stats.Loops.Load(); n != 0 {
			t.Errorf("Loops = %d, want 0", n)
		}
	})
}

func TestLooped(t *testing.T) {
	s := &Server{loopMark: []byte("00112233aabbccdd")}
	for _, tc := range []struct {
		name string
		head string
		want bool
	}{
		{"own mark", "GET / HTTP/1.1\r\nHost: a\r\nSluice-Via: 00112233aabbccdd\r\n\r\n", true},
		{"any case, second line", "GET / HTTP/1.1\r\nSluice-Via: 1111111111111111\r\nSLUICE-VIA: x, 00112233aabbccdd\r\n\r\n", true},
		{"foreign marks", "GET / HTTP/1.1\r\nSluice-Via: 1111111111111111\r\n\r\n", false},
		{"mark in another field", "GET / HTTP/1.1\r\nX-Note: 00112233aabbccdd\r\nSluice-Via: 1\r\n\r\n", false},
		{"longer name", "GET / HTTP/1.1\r\nSluice-Viaa: 00112233aabbccdd\r\n\r\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := s.looped([]byte(tc.head)); got != tc.want {
				t.Errorf("looped = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestCheckHeadNotesLoopField: checkHead says when the head has the field,
// so heads without it are never scanned again.
func TestCheckHeadNotesLoopField(t *testing.T) {
	hi, err := checkHead([]byte("GET / HTTP/1.1\r\nHost: a\r\nsluice-VIA: 1\r\n\r\n"), nil)
	if err != nil || !hi.loopMarks {
		t.Fatalf("loopMarks = %v, err %v; want true, nil", hi.loopMarks, err)
	}
	hi, err = checkHead([]byte("GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"), nil)
	if err != nil || hi.loopMarks {
		t.Fatalf("loopMarks = %v, err %v; want false, nil", hi.loopMarks, err)
	}
}
