package sip

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	gosip "github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/internal/testenv"
)

// The browser test: a WebRTC softphone (JsSIP in headless Chromium)
// registers over WSS through sluice to a Kamailio registrar with
// use_path, and takes calls from a UA over UDP that Kamailio sends back
// along the Path, through sluice, to the browser's connection. A BYE from
// either side ends a call.

// browserPage is the softphone: it registers alice, answers every call
// and reports what happens to the test's /log; the second call it ends
// itself once confirmed.
const browserPage = `<!doctype html>
<html><head><meta charset="utf-8"><script src="/jssip.js"></script></head><body>
<script>
const log = (m) => fetch('/log?m=' + encodeURIComponent(m));
window.addEventListener('error', (e) => log('error:' + e.message));
try {
  const params = new URLSearchParams(location.search);
  const socket = new JsSIP.WebSocketInterface(params.get('wss'));
  const ua = new JsSIP.UA({sockets: [socket], uri: 'sip:alice@test.local', register: true,
    register_expires: 600, session_timers: false, connection_recovery_min_interval: 1});
  let calls = 0;
  ua.on('registered', () => log('registered'));
  ua.on('registrationFailed', (e) => log('registration-failed:' + e.cause));
  ua.on('newRTCSession', (e) => {
    if (e.originator !== 'remote') return;
    const s = e.session;
    const n = ++calls;
    log('incoming:' + n);
    s.on('confirmed', () => {
      log('confirmed:' + n);
      if (n === 2) setTimeout(() => s.terminate(), 200);
    });
    s.on('ended', (ev) => log('ended:' + n + ':' + ev.originator));
    s.on('failed', (ev) => log('failed:' + n + ':' + ev.originator + ':' + ev.cause));
    s.answer({mediaConstraints: {audio: true, video: false}, pcConfig: {iceServers: []}});
  });
  ua.start();
} catch (e) { log('error:' + e); }
</script></body></html>`

// webrtcOffer is an SDP offer a browser accepts in setRemoteDescription:
// ICE credentials, a DTLS fingerprint, BUNDLE and rtcp-mux, Opus.
const webrtcOffer = "v=0\r\n" +
	"o=- 4611731400430051336 2 IN IP4 127.0.0.1\r\n" +
	"s=-\r\n" +
	"t=0 0\r\n" +
	"a=group:BUNDLE 0\r\n" +
	"a=msid-semantic: WMS\r\n" +
	"m=audio 9 UDP/TLS/RTP/SAVPF 111\r\n" +
	"c=IN IP4 127.0.0.1\r\n" +
	"a=rtcp:9 IN IP4 0.0.0.0\r\n" +
	"a=candidate:1 1 udp 2130706431 127.0.0.1 40000 typ host\r\n" +
	"a=ice-ufrag:Xq3f\r\n" +
	"a=ice-pwd:ab12cd34ef56gh78ij90kl12\r\n" +
	"a=ice-options:trickle\r\n" +
	"a=fingerprint:sha-256 7B:8B:F0:65:5F:78:E2:51:3B:AC:6F:F3:3F:46:1B:35:DC:B8:5F:64:1A:24:C2:43:F0:A1:58:D0:A1:2C:19:08\r\n" +
	"a=setup:actpass\r\n" +
	"a=mid:0\r\n" +
	"a=sendrecv\r\n" +
	"a=rtcp-mux\r\n" +
	"a=rtpmap:111 opus/48000/2\r\n"

// startKamailio runs Kamailio with sip/testdata/kamailio-registrar.cfg on
// a free loopback UDP port, in the foreground (-DD -E), and stops it by
// its PID when the test ends. It returns its address once it answers.
func startKamailio(t *testing.T) netip.AddrPort {
	t.Helper()
	bin := testenv.Tool(t, "kamailio", "kamailio")
	port := freeUDPPort(t)
	addr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port))
	cfg, err := os.ReadFile(filepath.Join("testdata", "kamailio-registrar.cfg"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "kamailio.cfg")
	if err := os.WriteFile(file, bytes.ReplaceAll(cfg, []byte("listen=LISTEN"), []byte("listen=udp:"+addr.String())), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-DD", "-E", "-f", file, "-Y", dir, "-P", filepath.Join(dir, "kamailio.pid"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	t.Cleanup(func() { // after startGroup's: Kamailio has stopped
		if t.Failed() {
			t.Logf("kamailio output:\n%s", tail(out.Bytes(), 6000))
		}
	})
	exited := startGroup(t, cmd)
	// Ready when it answers an OPTIONS.
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 4096)
	for i := 0; ; i++ {
		select {
		case <-exited:
			t.Fatalf("kamailio exited:\n%s", tail(out.Bytes(), 6000))
		default:
		}
		if i == 100 {
			t.Fatalf("kamailio does not answer on %s:\n%s", addr, tail(out.Bytes(), 6000))
		}
		la := c.LocalAddr().String()
		_, _ = fmt.Fprintf(c, "OPTIONS sip:ping@%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-ping-%d;rport\r\nMax-Forwards: 70\r\nFrom: <sip:t@test.local>;tag=p\r\nTo: <sip:ping@test.local>\r\nCall-ID: ping-%d@test\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n", addr, la, i, i)
		_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		n, err := c.Read(buf)
		if err == nil && bytes.HasPrefix(buf[:n], []byte("SIP/2.0 ")) {
			return addr
		}
		if err != nil && !os.IsTimeout(err) {
			time.Sleep(100 * time.Millisecond) // refused: not bound yet
		}
	}
}

// udpCaller is a UA over UDP that calls through Kamailio: it sends
// requests and reads what comes back, answering the BYEs it gets.
type udpCaller struct {
	t    *testing.T
	conn *net.UDPConn
	to   *net.UDPAddr
	addr string
}

func newUDPCaller(t *testing.T, proxy netip.AddrPort) *udpCaller {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &udpCaller{t: t, conn: c, to: net.UDPAddrFromAddrPort(proxy), addr: c.LocalAddr().String()}
}

func (c *udpCaller) send(m string) {
	c.t.Helper()
	if _, err := c.conn.WriteToUDP([]byte(m), c.to); err != nil {
		c.t.Fatal(err)
	}
}

// next returns the next message, or fails the test after d.
func (c *udpCaller) next(d time.Duration) (gosip.Message, *net.UDPAddr) {
	c.t.Helper()
	buf := make([]byte, 65535)
	_ = c.conn.SetReadDeadline(time.Now().Add(d))
	n, from, err := c.conn.ReadFromUDP(buf)
	if err != nil {
		c.t.Fatalf("caller: %v", err)
	}
	m, err := gosip.ParseMessage(buf[:n])
	if err != nil {
		c.t.Fatalf("caller: %v in %q", err, buf[:n])
	}
	return m, from
}

// dialog is what the caller keeps of an answered INVITE.
type dialog struct {
	callID, toTag, target, routes string
}

// invite calls alice and returns the dialog of the 2xx, after its ACK.
func (c *udpCaller) invite(callID string) dialog {
	c.t.Helper()
	c.send(fmt.Sprintf("INVITE sip:alice@test.local SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-%s-inv;rport\r\nMax-Forwards: 70\r\nFrom: <sip:caller@test.local>;tag=caller\r\nTo: <sip:alice@test.local>\r\nCall-ID: %s\r\nCSeq: 1 INVITE\r\nContact: <sip:caller@%s>\r\nContent-Type: application/sdp\r\nContent-Length: %d\r\n\r\n%s",
		c.addr, callID, callID, c.addr, len(webrtcOffer), webrtcOffer))
	for {
		m, _ := c.next(20 * time.Second)
		res, ok := m.(*gosip.Response)
		if !ok || res.CallID().Value() != callID {
			continue
		}
		switch {
		case res.StatusCode < 200:
			continue
		case res.StatusCode >= 300:
			c.t.Fatalf("INVITE %s answered %d %s", callID, res.StatusCode, res.Reason)
		}
		d := dialog{callID: callID}
		d.toTag, _ = res.To().Params.Get("tag")
		if ct := res.Contact(); ct != nil {
			d.target = ct.Address.String()
		}
		rrs := res.GetHeaders("Record-Route")
		for i := len(rrs) - 1; i >= 0; i-- {
			d.routes += "Route: " + rrs[i].Value() + "\r\n"
		}
		if d.target == "" || d.routes == "" {
			c.t.Fatalf("2xx without Contact or Record-Route:\n%s", res)
		}
		c.send(c.inDialog(d, "ACK", 1))
		return d
	}
}

// inDialog is a request of the caller in dialog d.
func (c *udpCaller) inDialog(d dialog, method string, cseq int) string {
	return fmt.Sprintf("%s %s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-%s-%s;rport\r\nMax-Forwards: 70\r\n%sFrom: <sip:caller@test.local>;tag=caller\r\nTo: <sip:alice@test.local>;tag=%s\r\nCall-ID: %s\r\nCSeq: %d %s\r\nContent-Length: 0\r\n\r\n",
		method, d.target, c.addr, d.callID, strings.ToLower(method), d.routes, d.toTag, d.callID, cseq, method)
}

// hangUp sends a BYE in d and waits for its 200.
func (c *udpCaller) hangUp(d dialog) {
	c.t.Helper()
	c.send(c.inDialog(d, "BYE", 2))
	for {
		m, _ := c.next(20 * time.Second)
		if res, ok := m.(*gosip.Response); ok && res.CallID().Value() == d.callID && res.CSeq().MethodName == gosip.BYE {
			if res.StatusCode != 200 {
				c.t.Fatalf("BYE answered %d %s", res.StatusCode, res.Reason)
			}
			return
		}
	}
}

// awaitBye waits for a BYE in d from the callee and answers it 200.
func (c *udpCaller) awaitBye(d dialog) {
	c.t.Helper()
	for {
		m, from := c.next(20 * time.Second)
		req, ok := m.(*gosip.Request)
		if !ok || req.CallID().Value() != d.callID || req.Method != gosip.BYE {
			continue
		}
		res := gosip.NewResponseFromRequest(req, 200, "OK", nil)
		if _, err := c.conn.WriteToUDP([]byte(res.String()), from); err != nil {
			c.t.Fatal(err)
		}
		return
	}
}

// TestBrowserRegisterAndCalls drives JsSIP in headless Chromium over WSS
// through sluice to Kamailio (use_path): the browser registers; a call
// to its AOR from a UDP caller reaches it along the Path and the flow,
// is answered and ended by the caller's BYE; a second is ended by the
// browser's BYE. It skips when Chromium or Kamailio is missing, unless
// CI is set.
func TestBrowserRegisterAndCalls(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end browser test skipped in -short mode")
	}
	chromium := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			chromium = p
			break
		}
	}
	if chromium == "" {
		testenv.Missing(t, "chromium not found (Debian package chromium; scripts/install-test-deps.sh installs it)")
	}
	kam := startKamailio(t)
	srvTLS, _ := testTLS(t)
	s := startServer(t, serverOpts{backends: []netip.AddrPort{kam}, mut: func(c *Config) {
		c.WSSListen, c.TLSConfig = "127.0.0.1:0", srvTLS
	}})

	events := make(chan string, 64)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(browserPage))
	})
	mux.HandleFunc("/jssip.js", func(w http.ResponseWriter, r *http.Request) {
		http.ServeFile(w, r, filepath.Join("testdata", "jssip", "jssip.iife.min.js"))
	})
	mux.HandleFunc("/log", func(w http.ResponseWriter, r *http.Request) {
		select {
		case events <- r.URL.Query().Get("m"):
		default:
		}
	})
	web := httptest.NewServer(mux)
	defer web.Close()

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("ignore-certificate-errors", true),
		chromedp.Flag("use-fake-ui-for-media-stream", true),
		chromedp.Flag("use-fake-device-for-media-stream", true))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	browser, cancelBrowser := chromedp.NewContext(allocCtx)
	defer cancelBrowser()
	page := web.URL + "/?wss=" + "wss://" + s.WSSAddr().String()
	if err := chromedp.Do(browser, chromedp.Navigate(page)); err != nil {
		t.Fatalf("chromium: %v", err)
	}

	var seen []string
	expect := func(want string) {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case e := <-events:
				t.Logf("browser: %s", e)
				seen = append(seen, e)
				if e == want {
					return
				}
				if strings.HasPrefix(e, "error:") || strings.HasPrefix(e, "failed:") || strings.HasPrefix(e, "registration-failed:") {
					t.Fatalf("browser: %s (events %v)", e, seen)
				}
			case <-timeout:
				t.Fatalf("browser did not report %q (events %v)", want, seen)
			}
		}
	}
	expect("registered")
	if s.flows.Len() != 1 || s.metrics.FlowPaths.Load() == 0 {
		t.Fatalf("flows %d, Paths added %d: want the browser's WSS flow and a Path on its REGISTER", s.flows.Len(), s.metrics.FlowPaths.Load())
	}

	caller := newUDPCaller(t, kam)
	// Call 1: ended by the caller.
	d := caller.invite("browser-call-1@test")
	expect("incoming:1")
	expect("confirmed:1")
	caller.hangUp(d)
	expect("ended:1:remote")
	// Call 2: ended by the browser.
	d = caller.invite("browser-call-2@test")
	expect("incoming:2")
	expect("confirmed:2")
	caller.awaitBye(d)
	expect("ended:2:local")

	if n := s.metrics.FlowRouted.Load(); n < 4 {
		t.Errorf("flow_routed %d: want the INVITEs, ACKs and the caller's BYE sent over the browser's flow", n)
	}
	if n := s.metrics.FlowFailed.Load() + s.metrics.ForgedFlows.Load(); n != 0 {
		t.Errorf("flow failures or forged tokens: %d", n)
	}
}
